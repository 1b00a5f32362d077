import APNsSimulator
import Foundation
import PostgresNIO
import PushEmbeddedPostgres
import PushProcess
import PushQueue
import PushQueueTesting
import Testing

/// Android through FCM with the real binary, real Postgres and the simulator's FCM side over real TLS: one
/// table, one worker, two platforms, each with its own credential named `default`.
@Suite("push-worker run with platform fcm jobs beside apns ones")
struct FCMDaemonTests {
    /// Starts a worker with the APNs key (APNS_*) and an FCM service account (FCM_SERVICE_ACCOUNT_PATH),
    /// both credential `default`.
    static func run(_ body: @Sendable (DaemonFixture, ChildProcess.Running) async throws -> Void) async throws {
        let account = try SimulatorFCMAccount.make()
        try await DaemonFixture.run(simulator: { $0.fcmAccounts = account.trusted }) { f in
            let path = try account.write(in: f.directory + "/fcm", host: "localhost", port: f.simulator.port)
            let worker = try f.startWorker(
                "w1",
                [
                    "--fcm-endpoint", "https://localhost:\(f.simulator.port)", "--fcm-ca-file", f.caFile,
                    "--max-retries", "3",
                ],
                environment: ["FCM_SERVICE_ACCOUNT_PATH": path]
            )
            defer {
                worker.signal(SIGKILL)
                worker.reap()
            }
            try await body(f, worker)
        }
    }

    static func fcmToken(_ n: Int) -> String { "fKx\(n):APA91bH-\(String(repeating: "x", count: 40))" }

    @Test(
        "a mixed queue, apns and fcm, both credential default: every job delivered by its own provider, FCM's message name recorded, apns_id as data.push_id"
    )
    func mixedQueue() async throws {
        try await Self.run { f, worker in
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}' FROM generate_series(1, 30) g
                """
            )
            try await f.db.execute(
                """
                INSERT INTO push.jobs (platform, topic, device_token, payload)
                SELECT 'fcm', 'com.example.app', 'fKx' || g || ':APA91bH-token', '{"notification":{"title":"hi"}}'
                  FROM generate_series(1, 30) g
                """
            )
            try await f.waitUntil(.seconds(60), "60 delivered") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 60
            }
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE platform = 'fcm' AND environment = 'fcm' AND provider_message_id LIKE 'projects/push-simulator/messages/%'"
                ) == 30
            )
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE platform = 'apns' AND provider_message_id IS NULL"
                ) == 30
            )
            let sends = f.simulator.requests.filter { $0.path.hasSuffix("/messages:send") && $0.status == 200 }
            #expect(sends.count == 30, "one FCM request per fcm job")
            let ids = Set(
                try await f.db.client.query("SELECT apns_id::text FROM push.jobs WHERE platform = 'fcm'")
                    .decode(String.self).collect()
            )
            #expect(
                Set(sends.compactMap(\.notificationID)) == ids,
                "each request carries its job's apns_id as data.push_id"
            )
            #expect(f.simulator.requests.filter { $0.path.hasPrefix("/3/device/") }.count == 30)
            #expect(f.simulator.faultCounters.accessTokenGrants == 1, "one access token for the whole drain")
            #expect(!worker.output.contains("ya29."), "the access token is never logged")
            try await FaultTests.assertInvariants(f, jobs: 60, diedWorkers: [])
        }
    }

    @Test(
        "short-lived access tokens (12 s), two workers sharing them through Postgres, a steady stream for 30 s: every token renewed ahead of its expiry, none sent expired (no 401), no pool called unreachable"
    )
    func shortLivedAccessTokens() async throws {
        try await DaemonFixture.run(
            fcm: true,
            expected: .seconds(35),
            mostlyWaiting: true,
            simulator: { $0.accessTokenLifetime = 12 }
        ) {
            f in
            let a = try f.startWorker("a", ["--log-level", "warning"])
            let b = try f.startWorker("b", ["--log-level", "warning"])
            defer {
                for worker in [a, b] {
                    worker.signal(SIGKILL)
                    worker.reap()
                }
            }
            let start = ContinuousClock.now
            var batch = 0
            while ContinuousClock.now - start < .seconds(30) {
                batch += 1
                try await f.db.execute(
                    """
                    INSERT INTO push.jobs (platform, topic, device_token, payload)
                    SELECT 'fcm', 'com.example.app', 'fKx' || \(batch) || '-' || g || ':APA91bH-token', '{}'
                      FROM generate_series(1, 5) g
                    """
                )
                try await Task.sleep(for: .milliseconds(250))
            }
            let jobs = batch * 5
            try await f.waitUntil(.seconds(60), "\(jobs) delivered") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == Int64(jobs)
            }
            let sends = f.simulator.requests.filter { $0.path.hasSuffix("/messages:send") }
            let refused = sends.filter { $0.status == 401 }.count
            let faults = f.simulator.faultCounters
            print(
                "12 s access tokens, two workers, \(jobs) FCM jobs over 30 s: \(sends.count) sends, \(refused) answered 401, \(faults.accessTokenGrants) grants, \(faults.accessTokensUsed) tokens used"
            )
            #expect(refused == 0, "no token is sent after its expiry")
            // Renewed at half a 12 s lifetime: about 5 renewals in 30 s, shared; a race may add one per renewal.
            #expect(faults.accessTokenGrants >= 4 && faults.accessTokenGrants <= 14, "\(faults.accessTokenGrants)")
            for worker in [a, b] {
                #expect(!worker.output.contains("unreachable"), "\(worker.output.suffix(1500))")
            }
            try await FaultTests.assertInvariants(f, jobs: jobs, diedWorkers: [])
        }
    }

    @Test("two workers share one access token through Postgres: the first stored wins, the other adopts it")
    func sharedAccessToken() async throws {
        try await DaemonFixture.run(fcm: true) { f in
            let a = try f.startWorker("a", ["--log-level", "error"])
            let b = try f.startWorker("b", ["--log-level", "error"])
            defer {
                for worker in [a, b] {
                    worker.signal(SIGKILL)
                    worker.reap()
                }
            }
            try await f.db.execute(
                """
                INSERT INTO push.jobs (platform, topic, device_token, payload)
                SELECT 'fcm', 'com.example.app', 'fKx' || g || ':APA91bH-token', '{}' FROM generate_series(1, 400) g
                """
            )
            try await f.waitUntil(.seconds(60), "400 delivered") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 400
            }
            let faults = f.simulator.faultCounters
            print(
                "two workers, 400 FCM jobs: \(faults.accessTokenGrants) access token grants, \(faults.accessTokensUsed) used"
            )
            #expect(faults.accessTokensUsed == 1, "one access token for the fleet")
            try await FaultTests.assertInvariants(f, jobs: 400, diedWorkers: [])
            #expect(faults.accessTokenGrants <= 2, "at most one exchange per worker (both may race at start)")
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.provider_tokens WHERE team_id = 'fcm:push-simulator'")
                    == 1
            )
            // check-keys names the FCM credential and, online, proves it by a token exchange alone.
            let endpoint = "https://localhost:\(f.simulator.port)"
            let arguments = [
                "check-keys", "--online", "--topic", "com.example.app", "--apns-endpoint", endpoint, "--apns-ca-file",
                f.caFile, "--fcm-endpoint", endpoint, "--fcm-ca-file", f.caFile,
            ]
            let keys = try await f.cli(arguments)
            #expect(keys.status == 0, "\(keys.output)")
            #expect(keys.output.contains("ok: credential default (fcm): project push-simulator"), "\(keys.output)")
            #expect(keys.output.contains("ok: credential default (fcm): the token endpoint granted an access token"))
            f.simulator.refuseAccount("push-worker@push-simulator.iam.gserviceaccount.com")
            let refused = try await f.cli(arguments)
            #expect(
                refused.status == 1 && refused.output.contains("FAIL: credential default (fcm)"),
                "\(refused.output)"
            )
        }
    }

    @Test(
        "UNREGISTERED: dead letter FC010, a push.invalid_tokens row for platform fcm, a later job for that token dead unsent; a device's QUOTA_EXCEEDED holds that job alone for Retry-After"
    )
    func unregisteredAndQuota() async throws {
        try await Self.run { f, _ in
            let gone = Self.fcmToken(1)
            let throttled = Self.fcmToken(2)
            f.simulator.script(gone, .respond(status: 404, reason: "UNREGISTERED"))
            f.simulator.script(throttled, .retryAfter(seconds: 2, times: 1))
            try await f.db.execute(
                "INSERT INTO push.jobs (platform, topic, device_token, payload) VALUES ('fcm', 'com.example.app', '\(gone)', '{\"data\":{\"a\":\"b\"}}'), ('fcm', 'com.example.app', '\(throttled)', '{\"data\":{\"a\":\"b\"}}')"
            )
            // A later job for the same token, enqueued now and due in 10 s: FCM will have called the token dead
            // by then (4 s was not always enough under the full suite's load: the first send came later).
            try await f.db.execute(
                "INSERT INTO push.jobs (platform, topic, device_token, payload, run_at) VALUES ('fcm', 'com.example.app', '\(gone)', '{}', now() + interval '10 seconds')"
            )
            try await f.waitUntil(.seconds(60), "the dead token's first job dead, the throttled one delivered") {
                let dead = try await f.db.int64("SELECT count(*) FROM push.dead_jobs WHERE reason = 'UNREGISTERED'")
                let delivered = try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'")
                return dead == 1 && delivered == 1
            }
            let dead = try await f.db.client.query(
                "SELECT reason, trap_ids, status, platform, error FROM push.dead_jobs WHERE device_token = \(gone) AND reason = 'UNREGISTERED'"
            ).decode((String, [String], Int16?, String, String).self).collect()
            #expect(dead.first?.0 == "UNREGISTERED" && dead.first?.1 == ["FC010"] && dead.first?.2 == 404)
            #expect(dead.first?.3 == "fcm")
            #expect(dead.first?.4.contains("FirebaseMessaging") == true, "\(dead.first?.4 ?? "")")
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.invalid_tokens WHERE platform = 'fcm' AND environment = 'fcm' AND device_token = '\(unescaped: gone)' AND reason = 'UNREGISTERED'"
                ) == 1
            )
            let quota = try await f.db.client.query(
                "SELECT attempts, trap_ids FROM push.jobs WHERE device_token = \(throttled)"
            ).decode((Int16, [String]).self).collect()
            #expect(quota.first?.0 == 2, "a device over its rate: the job's own retry, one attempt used")
            #expect(quota.first?.1 == ["FC020"])
            let throttledSends = f.simulator.requests.filter { $0.deviceToken == throttled }.map(\.receivedAt)
            #expect(throttledSends.count == 2)
            if throttledSends.count == 2 {
                #expect(throttledSends[1].timeIntervalSince(throttledSends[0]) >= 1.9, "resent after Retry-After")
            }
            // The later job for the dead token is dead-lettered at its claim, unsent.
            try await f.waitUntil(.seconds(30), "the later job dead TokenInvalidated") {
                try await f.db.int64(
                    "SELECT count(*) FROM push.dead_jobs WHERE reason = 'TokenInvalidated' AND 'FC010' = ANY (trap_ids)"
                ) == 1
            }
            #expect(f.simulator.requests.filter { $0.deviceToken == gone }.count == 1, "one request: the first job's")
            try await FaultTests.assertInvariants(f, jobs: 3, diedWorkers: [], rejectedBeforeSend: true)
            // The same token string as an APNs job of the same topic is not suppressed by FCM's verdict (it
            // would fail the hex rule anyway; the key includes the platform).
            #expect(try await f.db.int64("SELECT count(*) FROM push.invalid_tokens WHERE platform = 'apns'") == 0)
        }
    }

    @Test("the schema refuses what FCM has no place for, naming the rule")
    func constraints() async throws {
        try await TestPostgres.withDatabase { db in
            for (sql, rule) in [
                ("('fcm', 'com.example.app', 'tok:1', '{}', 'voip', NULL)", "fcm_jobs_take_no_push_type"),
                (
                    "('fcm', 'com.example.app', 'tok 1', '{}', 'alert', NULL)",
                    "fcm_device_token_must_be_printable_ascii_up_to_4096_bytes"
                ),
                ("('fcm', 'com.example.app', 'tok:1', '{}', 'alert', 1)", "fcm_priority_must_be_10_or_5"),
                ("('fcm', 'com.example.my_app', 'tok:1', '{}', 'alert', 5)", nil),
                (
                    "('apns', 'com.example.app', 'tok:1', '{}', 'alert', NULL)",
                    "device_token_must_be_hex_of_16_to_200_bytes"
                ),
                ("('web', 'com.example.app', 'tok:1', '{}', 'alert', NULL)", "platform_must_be_apns_or_fcm"),
            ] as [(String, String?)] {
                do {
                    try await db.execute(
                        "INSERT INTO push.jobs (platform, topic, device_token, payload, push_type, priority) VALUES \(sql)"
                    )
                    #expect(rule == nil, "\(sql) was accepted")
                } catch {
                    #expect(
                        rule != nil && String(reflecting: error).contains(rule!),
                        "\(sql): \(String(reflecting: error).prefix(300))"
                    )
                }
            }
            let accepted = try await db.int64(
                "SELECT count(*) FROM push.jobs WHERE platform = 'fcm' AND environment = 'fcm'"
            )
            #expect(accepted == 1)
            do {
                try await db.execute(
                    "INSERT INTO push.jobs (platform, environment, topic, device_token, payload) VALUES ('fcm', 'development', 'com.example.app', 'tok:2', '{}')"
                )
                Issue.record("an fcm job with environment development was accepted")
            } catch {
                #expect(String(reflecting: error).contains("fcm_jobs_have_no_environment"))
            }
        }
    }
}

/// The worker against an FCM stand-in in another language (Tests/Interop/fcm_standin.py: Python's h2 and
/// `cryptography`, written from Google's documentation), so the FCM side is not only tested against our own
/// simulator's reading of the same pages.
@Suite("FCM interop: the real binary against an independent stand-in")
struct FCMInteropTests {
    @Test(
        "the worker's JWT verifies with cryptography, its messages pass the stand-in's checks, and Google's documented answers (UNREGISTERED, the invalid-token INVALID_ARGUMENT, a device's QUOTA_EXCEEDED, THIRD_PARTY_AUTH_ERROR) land as the contract says"
    )
    func againstTheStandIn() async throws {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Interop/fcm_standin.py").path
        let probe = try ChildProcess.run("/usr/bin/env", ["python3", "-c", "import h2, cryptography"])
        try #require(
            probe.status == 0,
            "python3 with h2 and cryptography is needed: pip install 'httpx[http2]' cryptography (.ci/run installs them)"
        )
        try await DaemonFixture.run { f in
            let directory = f.directory + "/standin"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            try TestCertificate.localhost(in: directory)
            let port = try EmbeddedPostgres.freePort()
            let account = try SimulatorFCMAccount.make(projectID: "standin-project")
                .write(in: directory, host: "localhost", port: port)
            let log = directory + "/requests.jsonl"
            let standin = try ChildProcess.start(
                "/usr/bin/env",
                [
                    "python3", script, "--port", "\(port)", "--cert", directory + "/cert.pem", "--key",
                    directory + "/key.pem", "--service-account", account, "--log", log,
                ],
                environment: ["PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"],
                outputPath: directory + "/standin.out"
            )
            defer {
                standin.signal(SIGKILL)
                standin.reap()
            }
            try await f.waitUntil(.seconds(20), "the stand-in listening") { standin.output.contains("READY") }
            let worker = try f.startWorker(
                "w1",
                ["--fcm-endpoint", "https://localhost:\(port)", "--fcm-ca-file", directory + "/cert.pem"],
                environment: ["FCM_SERVICE_ACCOUNT_PATH": account]
            )
            defer {
                worker.signal(SIGKILL)
                worker.reap()
            }
            try await f.db.execute(
                """
                INSERT INTO push.jobs (platform, topic, device_token, payload, priority, collapse_id)
                SELECT 'fcm', 'com.example.app', 'fKx' || g || ':APA91bH-token',
                       ('{"notification":{"title":"hi"},"data":{"n":"' || g || '"}}')::jsonb, CASE WHEN g % 2 = 0 THEN 10 ELSE 5 END,
                       CASE WHEN g = 1 THEN 'score' END
                  FROM generate_series(1, 20) g
                UNION ALL SELECT 'fcm', 'com.example.app', 'unregistered:1', '{}', NULL, NULL
                UNION ALL SELECT 'fcm', 'com.example.app', 'invalid:1', '{}', NULL, NULL
                UNION ALL SELECT 'fcm', 'com.example.app', 'quota:1', '{}', NULL, NULL
                UNION ALL SELECT 'fcm', 'com.example.app', 'thirdparty:1', '{}', NULL, NULL
                """
            )
            try await f.waitUntil(.seconds(60), "21 delivered, 3 dead") {
                let delivered = try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'")
                let dead = try await f.db.int64("SELECT count(*) FROM push.dead_jobs")
                return delivered == 21 && dead == 3
            }
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE provider_message_id LIKE 'projects/standin-project/messages/%standin'"
                ) == 21
            )
            let dead = try await f.db.client.query(
                "SELECT device_token, reason, trap_ids FROM push.dead_jobs ORDER BY device_token"
            ).decode((String, String, [String]).self).collect()
            #expect(dead.map(\.0) == ["invalid:1", "thirdparty:1", "unregistered:1"])
            #expect(
                dead.filter { $0.0 != "thirdparty:1" }.allSatisfy { $0.2 == ["FC010"] },
                "Google's invalid-token shape and UNREGISTERED are both dead tokens: \(dead)"
            )
            #expect(
                dead.first { $0.0 == "thirdparty:1" }.map { $0.1 == "THIRD_PARTY_AUTH_ERROR" && $0.2 == ["FC031"] }
                    == true,
                "an iOS token without the project's APNs key: that job alone, FC031: \(dead)"
            )
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.invalid_tokens WHERE platform = 'fcm'") == 2
            )
            let quota = try await f.db.client.query(
                "SELECT attempts, trap_ids FROM push.jobs WHERE device_token = 'quota:1'"
            ).decode((Int16, [String]).self).collect()
            #expect(
                quota.first?.0 == 2 && quota.first?.1 == ["FC020"],
                "a device over its rate: its own retry: \(quota)"
            )
            // What the stand-in read: each job's apns_id as data.push_id, its priority and ttl as FCM spells them.
            let lines = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n")
            let records = lines.compactMap {
                try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
            }
            #expect(records.count == 25, "24 jobs, the quota one twice: \(records.count)")
            let ids = try await f.db.client.query(
                "SELECT device_token, apns_id::text FROM push.jobs UNION ALL SELECT device_token, apns_id::text FROM push.dead_jobs"
            ).decode((String, String).self).collect()
            let byToken = Dictionary(uniqueKeysWithValues: ids)
            for record in records {
                let token = record["token"] as? String ?? ""
                #expect(record["push_id"] as? String == byToken[token], "push_id of \(token)")
                // A notification message's tag is its push id: a resend replaces the shown one.
                if token.hasPrefix("fKx") {
                    #expect(record["tag"] as? String == byToken[token], "android.notification.tag of \(token)")
                } else {
                    #expect(record["tag"] == nil || record["tag"] is NSNull, "a data message has no tag: \(token)")
                }
                #expect((record["ttl"] as? String)?.range(of: #"^\d+s$"#, options: .regularExpression) != nil)
            }
            #expect(records.first { $0["token"] as? String == "fKx2:APA91bH-token" }?["priority"] as? String == "HIGH")
            #expect(
                records.first { $0["token"] as? String == "fKx1:APA91bH-token" }?["priority"] as? String == "NORMAL"
            )
            #expect(
                records.first { $0["token"] as? String == "fKx1:APA91bH-token" }?["collapse_key"] as? String == "score"
            )
        }
    }
}
