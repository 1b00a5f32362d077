import Foundation
import PushCore
import Testing

@Suite("Token fingerprints and the trap catalog")
struct TokenFingerprintTests {
    @Test("a fingerprint is 12 hex digits of SHA-256, stable, and never contains the token")
    func fingerprint() {
        let token = String(repeating: "7f3c", count: 16)
        let fp = tokenFingerprint(token)
        #expect(fp.count == 12)
        #expect(fp.allSatisfy { $0.isHexDigit })
        #expect(fp == tokenFingerprint(token))
        #expect(fp != tokenFingerprint(token + "0"))
        #expect(!token.contains(fp))
        // SHA-256("abc") starts ba7816bf8f01.
        #expect(tokenFingerprint("abc") == "ba7816bf8f01")
    }

    @Test("the trap catalog has the ids APNS.md names, in order, without duplicates")
    func catalog() {
        #expect(
            TrapID.all.map(\.rawValue) == [
                "MS011", "MS014", "MS015", "MS018", "MS020", "MS028", "MS030", "MS031", "MS032", "MS034", "MS035",
            ]
        )
    }
}

@Suite("HTTP dates and clock skew")
struct ClockSkewTests {
    @Test("an IMF-fixdate round-trips; anything else is nil; the skew is measured at the exchange's midpoint")
    func dates() {
        let date = Date(timeIntervalSince1970: 1_795_631_727)
        #expect(HTTPDate.format(date) == "Wed, 25 Nov 2026 18:35:27 GMT")
        #expect(HTTPDate.parse("Wed, 25 Nov 2026 18:35:27 GMT") == date)
        for bad in ["", "25 Nov 2026", "Wed, 25 Foo 2026 18:35:27 GMT", "Wed, 25 Nov 2026 25:00:00 GMT"] {
            #expect(HTTPDate.parse(bad) == nil, "\(bad)")
        }
        let skew = ClockSkew.measure(
            serverDate: "Wed, 25 Nov 2026 18:45:27 GMT",
            receivedAt: date.addingTimeInterval(1),
            latency: .seconds(2)
        )
        #expect(skew == 600.5)
        #expect(ClockSkew.measure(serverDate: nil, receivedAt: date, latency: .zero) == nil)
    }
}
