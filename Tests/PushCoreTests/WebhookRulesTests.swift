import Foundation
import Testing

@testable import PushCore

@Suite("Webhook rules: the signature, the retry schedule, the addresses refused")
struct WebhookRulesTests {
    @Test("the signature is HMAC-SHA256 of t.body keyed with the trimmed secret; verify checks it and the time")
    func signature() throws {
        let body = Array(#"{"job_id":1}"#.utf8)
        let secret = Data("  topsecret\n".utf8)
        let header = try #require(
            WebhookSignature.value(body: body, timestamp: 1_700_000_000, secretFileContent: secret)
        )
        // Computed independently: printf '1700000000.{"job_id":1}' | openssl dgst -sha256 -hmac topsecret
        #expect(
            header == "t=1700000000,v1="
                + WebhookSignature.hex(body: body, timestamp: 1_700_000_000, key: .init(data: Data("topsecret".utf8)))
        )
        let now = Date(timeIntervalSince1970: 1_700_000_100)
        #expect(
            WebhookSignature.verify(header: header, body: body, secretFileContent: Data("topsecret".utf8), now: now)
        )
        #expect(!WebhookSignature.verify(header: header, body: body + [0x20], secretFileContent: secret, now: now))
        #expect(!WebhookSignature.verify(header: header, body: body, secretFileContent: Data("other".utf8), now: now))
        #expect(
            !WebhookSignature.verify(
                header: header,
                body: body,
                secretFileContent: secret,
                now: now.addingTimeInterval(600)
            ),
            "an old signature is refused (replay)"
        )
        #expect(WebhookSignature.value(body: body, timestamp: 1, secretFileContent: Data(" \n\t".utf8)) == nil)
        // Only ASCII whitespace is trimmed (what Python's bytes.strip() removes): a no-break space is key.
        #expect(
            WebhookSignature.value(body: body, timestamp: 1, secretFileContent: Data("\u{A0}k\r\n\u{0B}".utf8))
                == "t=1,v1=" + WebhookSignature.hex(body: body, timestamp: 1, key: .init(data: Data("\u{A0}k".utf8)))
        )
    }

    @Test("the signature matches openssl's HMAC")
    func againstOpenSSL() throws {
        let body = #"{"event":"dead","job_id":42}"#
        let header = try #require(
            WebhookSignature.value(
                body: Array(body.utf8),
                timestamp: 1_700_000_000,
                secretFileContent: Data("k3y".utf8)
            )
        )
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["openssl", "dgst", "-sha256", "-hmac", "k3y"]
        let input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        input.fileHandleForWriting.write(Data("1700000000.\(body)".utf8))
        try input.fileHandleForWriting.close()
        process.waitUntilExit()
        let printed = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let hex = try #require(printed.split(separator: " ").last).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(header == "t=1700000000,v1=\(hex)")
    }

    @Test("2xx delivered, 410 gone, the rest retried: 5 s doubling to an hour with jitter, Retry-After honoured")
    func schedule() {
        #expect(WebhookPolicy.verdict(status: 204, attempt: 1, retryAfter: nil, jitter: 0) == .delivered)
        #expect(WebhookPolicy.verdict(status: 410, attempt: 1, retryAfter: nil, jitter: 0) == .gone)
        #expect(
            WebhookPolicy.verdict(status: 500, attempt: 1, retryAfter: nil, jitter: 0) == .retry(after: .seconds(5))
        )
        #expect(
            WebhookPolicy.verdict(status: nil, attempt: 3, retryAfter: nil, jitter: 0) == .retry(after: .seconds(20))
        )
        #expect(
            WebhookPolicy.verdict(status: 302, attempt: 2, retryAfter: nil, jitter: 1) == .retry(after: .seconds(12))
        )
        #expect(
            WebhookPolicy.verdict(status: 500, attempt: 40, retryAfter: nil, jitter: 1)
                == .retry(after: .seconds(3_600))
        )
        #expect(
            WebhookPolicy.verdict(status: 429, attempt: 1, retryAfter: .seconds(90), jitter: 0)
                == .retry(after: .seconds(90))
        )
        #expect(
            WebhookPolicy.verdict(status: 503, attempt: 1, retryAfter: .seconds(86_400), jitter: 0)
                == .retry(after: .seconds(3_600)),
            "a receiver's Retry-After is held to an hour"
        )
    }

    @Test(
        "the backoff doubles with the tries an undisturbed schedule could have made by the delivery's age: the same when left alone, 5 s again after a replay"
    )
    func backoffAfterReplay() {
        // Left alone: the n-th try comes 5 × (2ⁿ⁻¹ − 1) s after the outcome at the earliest.
        var age = 0.0
        for attempt in 1...14 {
            let byCount = WebhookPolicy.backoff(attempt: attempt, jitter: 0)
            #expect(
                WebhookPolicy.backoff(attempt: attempt, age: .milliseconds(Int64(age * 1_000)), jitter: 0) == byCount
            )
            // The next try after the longest jitter: still the same step.
            let jittered = WebhookPolicy.backoff(attempt: attempt, jitter: 1)
            #expect(
                WebhookPolicy.backoff(attempt: attempt, age: .milliseconds(Int64(age * 1_000)), jitter: 1) == jittered
            )
            age += byCount.seconds
        }
        // Replayed after 30 tries: its age starts again.
        #expect(WebhookPolicy.backoff(attempt: 31, age: .seconds(1), jitter: 0) == .seconds(5))
        #expect(WebhookPolicy.backoff(attempt: 32, age: .seconds(6), jitter: 0) == .seconds(10))
        #expect(WebhookPolicy.backoff(attempt: 31, jitter: 0) == .seconds(3_600), "without an age: by the count")
        #expect(
            WebhookPolicy.retryWait(attempt: 31, age: .seconds(1), retryAfter: .seconds(120), jitter: 0)
                == .seconds(120),
            "Retry-After still decides"
        )
    }

    @Test("loopback, private, link-local, shared and mapped addresses are refused; public ones pass")
    func addresses() {
        for private4: [UInt8] in [
            [127, 0, 0, 1], [10, 1, 2, 3], [172, 16, 0, 1], [172, 31, 255, 255], [192, 168, 1, 1],
            [169, 254, 169, 254], [100, 64, 0, 1], [0, 0, 0, 0], [224, 0, 0, 1], [255, 255, 255, 255],
        ] {
            #expect(WebhookAddress.privateRange(ofIPv4: private4) != nil, "\(private4)")
        }
        for public4: [UInt8] in [[8, 8, 8, 8], [172, 32, 0, 1], [192, 169, 0, 1], [100, 128, 0, 1], [1, 1, 1, 1]] {
            #expect(WebhookAddress.privateRange(ofIPv4: public4) == nil, "\(public4)")
        }
        var loopback6 = [UInt8](repeating: 0, count: 16)
        loopback6[15] = 1
        #expect(WebhookAddress.privateRange(ofIPv6: loopback6) == "loopback (::1)")
        var mapped = [UInt8](repeating: 0, count: 16)
        mapped[10] = 0xFF
        mapped[11] = 0xFF
        mapped[12...15] = [169, 254, 169, 254]
        #expect(
            WebhookAddress.privateRange(ofIPv6: mapped) == "link-local (169.254.0.0/16)",
            "the metadata address, mapped"
        )
        #expect(WebhookAddress.privateRange(ofIPv6: [0xFD] + [UInt8](repeating: 0, count: 15)) != nil)
        #expect(WebhookAddress.privateRange(ofIPv6: [0xFE, 0x80] + [UInt8](repeating: 0, count: 14)) != nil)
        #expect(
            WebhookAddress.privateRange(ofIPv6: [0x26, 0x06, 0x47, 0x00] + [UInt8](repeating: 1, count: 12)) == nil
        )
        #expect(
            WebhookAddress.privateRange(ofIPv6: [0xFE, 0xC0] + [UInt8](repeating: 0, count: 14)) != nil,
            "site-local"
        )
        // 6to4 of 10.0.0.1 and of 8.8.8.8; local-use NAT64.
        #expect(
            WebhookAddress.privateRange(ofIPv6: [0x20, 0x02, 10, 0, 0, 1] + [UInt8](repeating: 0, count: 10)) != nil
        )
        #expect(
            WebhookAddress.privateRange(ofIPv6: [0x20, 0x02, 8, 8, 8, 8] + [UInt8](repeating: 0, count: 10)) == nil
        )
        #expect(
            WebhookAddress.privateRange(
                ofIPv6: [0x00, 0x64, 0xFF, 0x9B, 0x00, 0x01] + [UInt8](repeating: 0, count: 10)
            )
                != nil
        )
    }

    @Test(
        "a hook's URL as shown: scheme, host, port and path; query and fragment as ?…, user info as …@, controls escaped"
    )
    func displayURL() {
        #expect(WebhookPolicy.displayURL("https://hooks.example.com:8443/p/q") == "https://hooks.example.com:8443/p/q")
        #expect(WebhookPolicy.displayURL("https://hooks.example.com/p?token=abc") == "https://hooks.example.com/p?…")
        #expect(WebhookPolicy.displayURL("https://hooks.example.com#frag") == "https://hooks.example.com?…")
        #expect(WebhookPolicy.displayURL("https://u:pw@hooks.example.com/p") == "https://…@hooks.example.com/p")
        #expect(WebhookPolicy.displayURL("https://hooks.example.com/a\r\nb") == "https://hooks.example.com/a\\u{D}\\nb")
    }

    @Test("a secret file is inside its directory by its text alone: absolute, no . or .., below the directory")
    func secretFileIsInside() {
        let directory = "/etc/push-worker/webhooks"
        for (path, inside) in [
            ("/etc/push-worker/webhooks/hook.secret", true),
            ("/etc/push-worker/webhooks//a/b.secret", true),
            ("/etc/push-worker/webhooks", false),
            ("/etc/push-worker/webhooks/", false),
            ("/etc/push-worker/webhooks-other/x", false),
            ("/etc/push-worker/webhooks/../AuthKey.p8", false),
            ("/etc/push-worker/webhooks/./x", false),
            ("etc/push-worker/webhooks/x", false),
            ("/etc/passwd", false),
        ] {
            #expect(WebhookPolicy.secretFileIsInside(path, directory: directory) == inside, "\(path)")
        }
        #expect(WebhookPolicy.secretFileIsInside("/srv/s/x", directory: "/srv/s/"))
        #expect(!WebhookPolicy.secretFileIsInside("/srv/s/x", directory: "srv/s"))
        #expect(!WebhookPolicy.secretFileIsInside("/srv/x", directory: "/srv/s/.."))
        // "/" confines nothing; a combining mark after a "/" hides no ".." from the check; equivalent names are
        // not equal bytes.
        #expect(!WebhookPolicy.secretFileIsInside("/etc/passwd", directory: "/"))
        #expect(!WebhookPolicy.secretFileIsInside("/srv/s/..\u{0338}/../x", directory: "/srv/s"))
        #expect(!WebhookPolicy.secretFileIsInside("/srv/s/../\u{0338}x", directory: "/srv/s"))
        #expect(!WebhookPolicy.secretFileIsInside("/srv/\u{212A}/x", directory: "/srv/K"))
    }
}
