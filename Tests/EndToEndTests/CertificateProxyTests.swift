import APNsSimulator
import Foundation
import PushProcess
import PushQueue
import PushQueueTesting
import Testing

/// Certificate credentials and HTTPS proxies, end to end with the real binary: what the simulator recorded
/// (no authorization header, the certificate's topic; the requests that came through the proxy) and each
/// job's final row.
@Suite("Certificates and proxies")
struct CertificateProxyTests {
    /// Writes `text` to `path` with `mode`.
    static func write(_ text: String, _ path: String, mode: Int = 0o600) throws {
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: path)
    }

    @Test(
        "certificate credentials (.p12 with a password file, PEM cert + key) send without a provider token; a certificate for the other environment is refused before sending; a revoked one is held until APNs takes it; bad files are named with the fix"
    )
    func certificates() async throws {
        try await DaemonFixture.run(simulator: { $0.environment = "production" }) { f in
            let dir = f.directory
            let universal = try f.simulator.issueProviderCertificate(bundleID: "com.example.app")
            try Self.write(universal.certificatePEM, dir + "/cert.pem", mode: 0o644)
            try Self.write(universal.keyPEM, dir + "/key.pem")
            try Self.write("correct horse\n", dir + "/p12.pass")
            let export = try ChildProcess.run(
                "/usr/bin/env",
                [
                    "openssl", "pkcs12", "-export", "-in", dir + "/cert.pem", "-inkey", dir + "/key.pem", "-out",
                    dir + "/apns.p12", "-passout", "file:\(dir)/p12.pass",
                ]
            )
            try #require(export.status == 0, "openssl pkcs12 -export: \(export.output)")
            chmod(dir + "/apns.p12", 0o600)
            let sandboxOnly = try f.simulator.issueProviderCertificate(bundleID: "com.example.dev", kind: .development)
            try Self.write(sandboxOnly.certificatePEM, dir + "/dev.pem", mode: 0o644)
            try Self.write(sandboxOnly.keyPEM, dir + "/dev.key")
            let revoked = try f.simulator.issueProviderCertificate(bundleID: "com.example.rev")
            try Self.write(revoked.certificatePEM, dir + "/rev.pem", mode: 0o644)
            try Self.write(revoked.keyPEM, dir + "/rev.key")
            let config = dir + "/config.json"
            try Self.write(
                """
                {"credentials": {
                  "default": {"team_id": "\(f.credentials.teamID)", "key_id": "\(f.credentials.keyID)", "key_path": "\(f.keyPath)"},
                  "pem": {"type": "certificate", "cert_path": "\(dir)/cert.pem", "key_path": "\(dir)/key.pem"},
                  "p12": {"type": "certificate", "p12_path": "\(dir)/apns.p12", "password_file": "\(dir)/p12.pass"},
                  "sandbox-cert": {"type": "certificate", "cert_path": "\(dir)/dev.pem", "key_path": "\(dir)/dev.key"},
                  "revoked": {"type": "certificate", "cert_path": "\(dir)/rev.pem", "key_path": "\(dir)/rev.key"}
                }}
                """,
                config,
                mode: 0o644
            )
            let checked = try await f.cli(["check-keys", "--config", config])
            #expect(checked.status == 0, "\(checked.output)")
            #expect(
                checked.output.contains("ok: credential p12: certificate 'Apple Push Services: com.example.app'")
                    && checked.output.contains("topic com.example.dev, for development"),
                "\(checked.output)"
            )

            for (topic, fill, credential, count) in [
                ("com.example.app", "0", "pem", 5), ("com.example.app", "a", "p12", 5),
                ("com.example.dev", "d", "sandbox-cert", 3), ("com.example.rev", "e", "revoked", 4),
            ] {
                try await f.db.execute(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload, credential)
                    SELECT '\(topic)', lpad(to_hex(g), 64, '\(fill)'), '{"aps":{"alert":"x"}}', '\(credential)'
                      FROM generate_series(1, \(count)) g
                    """
                )
            }
            f.simulator.refuseCertificate(topic: "com.example.rev", reason: "BadCertificate")
            let worker = try ChildProcess.start(
                DaemonFixture.binary,
                [
                    "run", "--worker-id", "certs", "--config", config, "--apns-endpoint",
                    "https://localhost:\(f.simulator.port)", "--apns-ca-file", f.caFile, "--poll-interval-ms", "200",
                    "--no-metrics", "--log-level", "info", "--credential-pause", "2s",
                ],
                environment: ["DATABASE_URL": f.db.url.connectionString],
                outputPath: dir + "/certs.log"
            )
            f.children.add(worker)
            defer {
                worker.signal(SIGTERM)
                worker.reap()
            }
            try await f.waitUntil(.seconds(30), "the certificate jobs delivered") {
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE credential IN ('pem', 'p12') AND state = 'delivered'"
                )
                    == 10
            }
            // A development-only certificate and production jobs: refused before sending, only those jobs.
            try await f.waitUntil(.seconds(30), "the wrong-environment jobs dead-lettered") {
                try await f.db.int64(
                    "SELECT count(*) FROM push.dead_jobs WHERE credential = 'sandbox-cert' AND reason = 'BadCertificateEnvironment'"
                ) == 3
            }
            #expect(!f.simulator.requests.contains { $0.certificateTopic == "com.example.dev" }, "never sent")
            // A revoked certificate (APNs answers BadCertificate): credential fatal, held, uncounted, one refusal
            // per pause, and sending resumes by itself once APNs accepts it again.
            @Sendable func refusals() -> Int { f.simulator.requests.filter { $0.reason == "BadCertificate" }.count }
            try await f.waitUntil(.seconds(30), "the revoked certificate refused") { refusals() > 0 }
            try await Task.sleep(for: .seconds(3))
            let pauses = worker.output.components(separatedBy: "APNs refused credential 'revoked'").count - 1
            // A certificate connection has no one-stream phase: the first sends may all be in flight before the
            // first refusal comes back (4 jobs); after that, one per pause.
            #expect(pauses >= 1 && refusals() <= 4 + 2 * pauses, "\(refusals()) refusals for \(pauses) pauses")
            // Held and uncounted: back to pending with no attempt spent, once each refusal's outcome is written
            // (a snapshot can catch a retry in flight, running with its attempt, on a loaded machine).
            try await f.waitUntil(.seconds(30), "the revoked certificate's 4 jobs pending with 0 attempts") {
                let held = try await f.db.client.query(
                    "SELECT state, attempts FROM push.jobs WHERE credential = 'revoked'"
                ).decode((String, Int32).self).collect()
                return held.count == 4 && held.allSatisfy { $0.0 == "pending" && $0.1 == 0 }
            }
            f.simulator.refuseCertificate(topic: "com.example.rev", reason: nil)
            try await f.waitUntil(.seconds(30), "the renewed certificate's jobs delivered") {
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE credential = 'revoked' AND state = 'delivered'"
                ) == 4
            }
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE credential = 'revoked' AND attempts > 1")
                    == 0
            )
            let sent = f.simulator.requests.filter { $0.status == 200 }
            #expect(sent.count == 14, "one request per delivered job")
            #expect(
                sent.allSatisfy {
                    !$0.hadAuthorization && ["com.example.app", "com.example.rev"].contains($0.certificateTopic ?? "")
                }
            )
            #expect(!worker.output.contains("BEGIN"), "no key or certificate material in the log")
            worker.signal(SIGTERM)
            worker.reap()
            try await FaultTests.assertInvariants(f, jobs: 17, diedWorkers: [])

            // The operations guide's conversion: one PEM with certificate and key, named twice.
            let combined = try ChildProcess.run(
                "/usr/bin/env",
                [
                    "openssl", "pkcs12", "-in", dir + "/apns.p12", "-nodes", "-out", dir + "/all.pem", "-passin",
                    "file:\(dir)/p12.pass",
                ]
            )
            try #require(combined.status == 0, "\(combined.output)")
            chmod(dir + "/all.pem", 0o600)
            try Self.write(
                #"{"credentials": {"all": {"type": "certificate", "cert_path": "\#(dir)/all.pem", "key_path": "\#(dir)/all.pem"}}}"#,
                dir + "/combined.json",
                mode: 0o644
            )
            let single = try await f.cli(["check-keys", "--config", dir + "/combined.json"])
            #expect(single.status == 0 && single.output.contains("ok: credential all: certificate"), "\(single.output)")

            // Bad files: each refusal names the file and the fix.
            let badCases: [(String, String, [String])] = [
                (
                    #"{"type": "certificate", "p12_path": "\#(dir)/apns.p12", "password_file": "\#(dir)/wrong.pass"}"#,
                    "wrong.pass", ["apns.p12", "password"]
                ),
                (
                    #"{"type": "certificate", "cert_path": "\#(dir)/cert.pem", "key_path": "\#(dir)/dev.key"}"#, "",
                    ["dev.key", "does not belong to the certificate"]
                ),
                (
                    #"{"type": "certificate", "cert_path": "\#(dir)/cert.pem", "key_path": "\#(dir)/missing.key"}"#, "",
                    ["missing.key", "does not exist"]
                ),
                (#"{"type": "certificate", "cert_path": "\#(dir)/cert.pem"}"#, "", ["cert_path and key_path"]),
                (
                    #"{"type": "certificate", "p12_path": "\#(dir)/apns.p12"}"#, "",
                    ["apns.p12", "password_file"]
                ),
            ]
            try Self.write("not it\n", dir + "/wrong.pass")
            for (credential, _, fragments) in badCases {
                let bad = dir + "/bad.json"
                try Self.write(#"{"credentials": {"c": \#(credential)}}"#, bad, mode: 0o644)
                let result = try await f.cli(["check-keys", "--config", bad])
                #expect(result.status != 0, "\(credential)")
                for fragment in fragments {
                    #expect(result.output.contains(fragment), "\(credential): \(result.output)")
                }
            }
        }
    }

    @Test(
        "--https-proxy: APNs sends, FCM token exchanges and sends, channel management and webhook POSTs (tunnelled to the checked address) go through a real CONNECT proxy with basic auth; a refused proxy says why; NO_PROXY bypasses it"
    )
    func proxy() async throws {
        try await DaemonFixture.run(fcm: true) { f in
            let (proxy, port) = try await TinyProxy.start(in: f.directory, extraConfig: ["BasicAuth pushuser s3cret"])
            f.children.add(proxy)
            defer {
                proxy.signal(SIGTERM)
                proxy.reap()
            }
            let endpoint = ["--apns-endpoint", "https://localhost:\(f.simulator.port)", "--apns-ca-file", f.caFile]
            let proxyURL = "http://pushuser:s3cret@127.0.0.1:\(port)"

            // Channel management through the proxy (the CLI), then sends through it (the daemon).
            let created = try await f.cli(
                ["channels", "create", "--bundle-id", "com.example.app", "--https-proxy", proxyURL] + endpoint
            )
            #expect(created.status == 0, "\(created.output)")
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"via proxy"}}' FROM generate_series(1, 20) g
                """
            )
            // Android jobs too: FCM's token exchange and sends take the same proxy.
            try await f.db.execute(
                """
                INSERT INTO push.jobs (platform, topic, device_token, payload)
                SELECT 'fcm', 'com.example.app', 'fKx' || g || ':APA91bH-token', '{}' FROM generate_series(1, 10) g
                """
            )
            // A webhook on delivered outcomes to an https:// receiver: its POSTs take the proxy too, tunnelled to
            // the address the worker resolved and checked (loopback here, hence --webhooks-allow-private).
            let secret = try WebhookDaemonTests.secret(in: f.directory)
            let tls = try TestCertificate.localhost(in: f.directory)
            let receiver = try await WebhookReceiver.start(
                in: f.directory,
                secretFile: secret,
                seed: 1,
                delay: 0,
                tls: tls
            )
            defer { receiver.stop() }
            let added = try await f.cli([
                "webhooks", "add", "https://localhost:\(receiver.port)/ok", "--events", "delivered", "--secret-file",
                secret,
            ])
            #expect(added.status == 0, "\(added.output)")
            let worker = try f.startWorker(
                "proxied",
                [
                    "--https-proxy", proxyURL, "--log-level", "info", "--webhooks-allow-private", "--webhooks-ca-file",
                    tls.certificate,
                ]
            )
            defer {
                worker.signal(SIGTERM)
                worker.reap()
            }
            try await f.waitUntil(.seconds(30), "every job delivered through the proxy") {
                try await f.unfinished() == 0
            }
            try await f.waitUntil(.seconds(30), "every delivered outcome's webhook taken") {
                Set(receiver.requests.compactMap(\.delivery)).count == 30
            }
            worker.signal(SIGTERM)
            worker.reap()
            let tunnels = proxy.output.components(separatedBy: "CONNECT localhost:\(f.simulator.port)").count - 1
            // The CLI's, the worker's APNs connection, its FCM token exchange and its FCM sends.
            #expect(tunnels >= 4, "every connection went through a tunnel: \(proxy.output.suffix(1500))")
            let hookTunnels = proxy.output.components(separatedBy: "CONNECT 127.0.0.1:\(receiver.port) ").count - 1
            #expect(
                hookTunnels == receiver.requests.count && !proxy.output.contains("CONNECT localhost:\(receiver.port)"),
                "each webhook POST through its own tunnel to the checked address, never the name"
            )
            #expect(receiver.requests.allSatisfy { $0.signed })
            #expect(f.simulator.requests.filter { $0.status == 200 && $0.deviceToken != nil }.count == 30)
            #expect(f.simulator.faultCounters.accessTokenGrants == 1)
            #expect(!worker.output.contains("s3cret"), "the proxy password never reaches a log")
            #expect(worker.output.contains("http://pushuser:***@127.0.0.1:\(port)"), "\(worker.output.prefix(2000))")
            try await FaultTests.assertInvariants(f, jobs: 30, diedWorkers: [])

            // A refused proxy: the sentence names the proxy's answer and the fix; never the password.
            let refused = try await f.cli(
                [
                    "channels", "list", "--bundle-id", "com.example.app", "--https-proxy",
                    "http://pushuser:nope@127.0.0.1:\(port)",
                ]
                    + endpoint
            )
            #expect(refused.status != 0)
            #expect(
                refused.output.contains("refused CONNECT") && refused.output.contains("--https-proxy-auth-file"),
                "\(refused.output)"
            )
            #expect(!refused.output.contains("nope"))

            // Credentials from a file instead of the URL.
            try Self.write("pushuser:s3cret\n", f.directory + "/proxy.auth")
            let fromFile = try await f.cli(
                [
                    "channels", "list", "--bundle-id", "com.example.app", "--https-proxy", "http://127.0.0.1:\(port)",
                    "--https-proxy-auth-file", f.directory + "/proxy.auth",
                ] + endpoint
            )
            #expect(fromFile.status == 0, "\(fromFile.output)")

            // NO_PROXY names the host: a dead proxy is never used.
            let before = proxy.output.components(separatedBy: "CONNECT localhost").count
            let bypassArguments =
                [
                    "DATABASE_URL=\(f.db.url.connectionString)", "APNS_KEY_PATH=\(f.keyPath)",
                    "APNS_KEY_ID=\(f.credentials.keyID)", "APNS_TEAM_ID=\(f.credentials.teamID)",
                    "HTTPS_PROXY=http://127.0.0.1:1", "NO_PROXY=example.org,localhost",
                    DaemonFixture.binary, "channels", "list", "--bundle-id", "com.example.app",
                ] + endpoint
            // Off the concurrency pool: the in-process simulator it talks to needs it.
            let bypass = try await offPool { try ChildProcess.run("/usr/bin/env", bypassArguments) }
            #expect(bypass.status == 0, "\(bypass.output)")
            #expect(proxy.output.components(separatedBy: "CONNECT localhost").count == before)

            // A proxy URL that cannot work is refused before anything starts.
            for (url, fragment) in [
                ("https://proxy.internal:3128", "only http://"), ("http://proxy.internal", "has no port"),
            ] {
                let bad = try await f.cli(["check-keys", "--https-proxy", url])
                #expect(bad.status != 0 && bad.output.contains(fragment), "\(url): \(bad.output)")
            }
        }
    }
}
