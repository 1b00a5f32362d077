import APNsSimulator
import Foundation
import PostgresNIO
import PushEmbeddedPostgres
import PushProcess
import PushQueue
import PushQueueTesting
import Testing

@Suite("push-worker run, end to end: the real binary, real Postgres, the simulator over TLS")
struct DaemonTests {
    @Test("outcomes: delivered, 410, 429 with Retry-After, 503 budgets by priority, pre-send rejections")
    func outcomes() async throws {
        try await DaemonFixture.run(expected: .seconds(25)) { f in
            let t = (
                ok: DaemonFixture.token(1), gone: DaemonFixture.token(2), throttled: DaemonFixture.token(3),
                failing10: DaemonFixture.token(4), failing5: DaemonFixture.token(5), big: DaemonFixture.token(6),
                suffixed: DaemonFixture.token(7), expired: DaemonFixture.token(8)
            )
            f.simulator.script(t.gone, .unregistered(timestampMs: 1_700_000_000_123))
            f.simulator.script(t.throttled, .retryAfter(seconds: 1, times: 2))
            f.simulator.script(t.failing10, .respond(status: 503, reason: "ServiceUnavailable"))
            f.simulator.script(t.failing5, .respond(status: 503, reason: "ServiceUnavailable"))
            let big = String(repeating: "x", count: 4_200)
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, priority, expires_at) VALUES
                ('com.example.app', '\(t.ok)', '{"aps":{"alert":"hi"}}', NULL, NULL),
                ('com.example.app', '\(t.gone)', '{"aps":{"alert":"hi"}}', NULL, NULL),
                ('com.example.app', '\(t.throttled)', '{"aps":{"alert":"hi"}}', NULL, NULL),
                ('com.example.app', '\(t.failing10)', '{"aps":{"alert":"hi"}}', 10, NULL),
                ('com.example.app', '\(t.failing5)', '{"aps":{"alert":"hi"}}', 5, NULL),
                ('com.example.app', '\(t.big)', '{"aps":{"alert":"\(big)"}}', NULL, NULL),
                ('com.example.app.voip', '\(t.suffixed)', '{"aps":{"alert":"hi"}}', NULL, NULL),
                ('com.example.app', '\(t.expired)', '{"aps":{"alert":"hi"}}', NULL, now() - interval '1 minute')
                """
            )
            // The device registry (schema 17): the gone token's device, registered before APNs' 410 instant, is
            // marked from the answer; the delivered one's stays live.
            try await f.db.execute(
                """
                INSERT INTO push.devices (recipient, topic, token)
                VALUES ('user:1', 'com.example.app', '\(t.gone)'), ('user:1', 'com.example.app', '\(t.ok)')
                """
            )
            try await f.db.execute(
                """
                DO $$ BEGIN
                    PERFORM set_config('push.internal_update', 'on', true);
                    UPDATE push.devices SET registered_at = '2023-01-01T00:00:00Z' WHERE token = '\(t.gone)';
                END $$
                """
            )
            let worker = try f.startWorker()
            try await f.waitUntil(.seconds(60), "every job terminal") { try await f.unfinished() == 0 }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0, "SIGTERM drains and exits 0: \(worker.output.suffix(2000))")

            func dead(
                _ token: String
            ) async throws -> (reason: String, attempts: Int16, traps: [String], status: Int16?)? {
                let rows = try await f.db.client.query(
                    "SELECT reason, attempts, trap_ids, status FROM push.dead_jobs WHERE device_token = \(token)"
                )
                .decode((String, Int16, [String], Int16?).self)
                for try await row in rows { return row }
                return nil
            }
            func requests(_ token: String) -> [RecordedRequest] {
                f.simulator.requests.filter { $0.deviceToken == token }
            }

            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE device_token = '\(unescaped: t.ok)' AND state = 'delivered' AND status = 200"
                ) == 1
            )

            let gone = try #require(try await dead(t.gone))
            #expect(gone.reason == "Unregistered" && gone.traps == ["MS020"] && gone.status == 410)
            #expect(
                try await f.db.int64(
                    "SELECT apns_timestamp_ms FROM push.invalid_tokens WHERE device_token = '\(unescaped: t.gone)'"
                ) == 1_700_000_000_123
            )
            #expect(
                try await f.db.int64(
                    """
                    SELECT count(*) FROM push.devices
                     WHERE token = '\(unescaped: t.gone)' AND invalidated_reason = 'Unregistered'
                       AND invalidated_at = to_timestamp(1700000000.123)
                    """
                ) == 1,
                "the gone token's device is marked with APNs' instant"
            )
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.devices WHERE token = '\(unescaped: t.ok)' AND invalidated_at IS NULL"
                ) == 1
            )
            // What an operator sees: fingerprints, never the tokens.
            let shown = try await f.cli(["devices", "show", "user:1"])
            print("devices show user:1:\n\(shown.output)")
            #expect(shown.status == 0 && shown.output.contains("recipient user:1: 2 devices, 1 live"))
            #expect(shown.output.contains("invalidated 2023-11-14 22:13:20Z (Unregistered)"))
            #expect(!shown.output.contains(t.gone) && !shown.output.contains(t.ok))
            let listed = try await f.cli(["devices"])
            print("devices:\n\(listed.output)")
            #expect(
                listed.status == 0
                    && listed.output.contains("devices 2 (1 live, 1 invalidated); recipients reachable 1")
            )
            let nobody = try await f.cli(["devices", "show", "user:404"])
            #expect(nobody.status != 0 && nobody.output.contains("no device is registered for recipient user:404"))

            let throttled = try await f.db.client.query(
                "SELECT attempts, trap_ids, state FROM push.jobs WHERE device_token = \(t.throttled)"
            )
            .decode((Int16, [String], String).self).collect()
            #expect(throttled.first?.0 == 3 && throttled.first?.1 == ["MS015"] && throttled.first?.2 == "delivered")
            let throttledTimes = requests(t.throttled).map(\.receivedAt)
            #expect(throttledTimes.count == 3)
            for (earlier, later) in zip(throttledTimes, throttledTimes.dropFirst()) {
                #expect(later.timeIntervalSince(earlier) >= 0.99, "no attempt before Retry-After")
            }

            // A 5xx that would end a job while nothing written since its previous request was answered (a quiet
            // queue: maybe an outage's first moments) sends it back once more uncounted; its history says so.
            func uncounted(_ token: String) async throws -> Int64 {
                try await f.db.int64(
                    """
                    SELECT count(*) FROM push.dead_jobs, jsonb_array_elements(history) AS h
                     WHERE device_token = '\(unescaped: token)' AND h->>'outcome' = 'requeue'
                    """
                )
            }
            #expect(try await dead(t.failing10)?.attempts == 3, "priority 10: 3 attempts")
            #expect(try await requests(t.failing10).count == 3 + Int(uncounted(t.failing10)))
            #expect(try await dead(t.failing5)?.attempts == 4, "priority 5: 4 attempts")
            #expect(try await requests(t.failing5).count == 4 + Int(uncounted(t.failing5)))

            #expect(try await dead(t.big)?.traps == ["MS011"])
            #expect(try await dead(t.suffixed)?.traps == ["MS018"])
            #expect(try await dead(t.expired)?.reason == "Expired")
            for token in [t.big, t.suffixed, t.expired] {
                #expect(requests(token).isEmpty, "refused before any request")
            }
        }
    }

    @Test(
        "kill -9 mid-run with thousands in flight, restart: every job delivered once terminal, none running, one apns_id per job"
    )
    func crashAndRestart() async throws {
        try await DaemonFixture.run { f in
            let count = 3_000
            // Priority 5 and a wide retry budget: on a loaded machine a send may time out; the test is
            // about crash recovery, not budgets.
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, priority)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}', 5 FROM generate_series(1, \(count)) AS g
                """
            )
            for n in stride(from: 1, through: count, by: 3) {
                f.simulator.script(DaemonFixture.token(n), .latency(.milliseconds(200)))
            }
            let timings = ["--lease", "5s", "--request-timeout-ms", "4000", "--max-retries", "8"]
            let first = try f.startWorker("crashy", timings)
            try await f.waitUntil(.seconds(60), "some deliveries") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") >= 300
            }
            first.signal(SIGKILL)
            first.reap()
            let runningAtCrash = try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'running'")
            print("running at kill -9: \(runningAtCrash)")

            let second = try f.startWorker("survivor", timings)
            do {
                try await f.waitUntil(.seconds(90), "every job terminal after restart") {
                    try await f.unfinished() == 0
                }
            } catch {
                let states = try await f.db.client.query(
                    "SELECT state || ':' || coalesce(locked_by, '-') || ':' || attempts || ':' || count(*) FROM push.jobs GROUP BY state, locked_by, attempts"
                ).decode(String.self).collect()
                print(
                    "job states at the timeout (state:locked_by:attempts:count): \(states); dead letters: \(try await f.db.int64("SELECT count(*) FROM push.dead_jobs"))"
                )
                print("restarted worker log: \(second.output.suffix(3000))")
                second.signal(SIGKILL)
                throw error
            }
            second.signal(SIGTERM)
            #expect(second.wait() == 0)

            #expect(try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == Int64(count))
            #expect(try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'running'") == 0)
            let deadReasons = try await f.db.client.query(
                "SELECT reason || ' x' || count(*) || ' attempts ' || max(attempts) FROM push.dead_jobs GROUP BY reason"
            ).decode(String.self).collect()
            #expect(deadReasons.isEmpty, "dead letters: \(deadReasons)")
            // Every request for a job carried that job's apns_id, before and after the crash.
            var jobIDs: [String: String] = [:]
            for try await (token, apnsID) in try await f.db.client.query(
                "SELECT device_token, apns_id::text FROM push.jobs"
            ).decode((String, String).self) {
                jobIDs[token] = apnsID
            }
            var seen: [String: Set<String>] = [:]
            for request in f.simulator.requests {
                if let token = request.deviceToken { seen[token, default: []].insert(request.headers["apns-id"] ?? "") }
            }
            #expect(seen.count == count)
            #expect(seen.allSatisfy { token, ids in ids == [jobIDs[token] ?? "?"] })
        }
    }

    @Test("two workers on one database never send one job twice in the healthy path; both drain on SIGTERM")
    func twoWorkers() async throws {
        try await DaemonFixture.run { f in
            let count = 2_000
            let a = try f.startWorker("a")
            let b = try f.startWorker("b")
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}' FROM generate_series(1, \(count)) AS g
                """
            )
            try await f.waitUntil(.seconds(60), "all delivered") { try await f.unfinished() == 0 }
            // Each worker's own count of the jobs it delivered (a delivered attempt is not kept in history).
            var delivered: [Int] = []
            for worker in [a, b] {
                let metrics = try await f.get(worker, "/metrics").1
                let line = metrics.split(separator: "\n").first {
                    $0.hasPrefix(#"push_outcomes_total{outcome="delivered"}"#)
                }
                delivered.append(Int(line?.split(separator: " ").last ?? "") ?? 0)
            }
            a.signal(SIGTERM)
            b.signal(SIGTERM)
            #expect(a.wait() == 0)
            #expect(b.wait() == 0)
            let ids = f.simulator.requests.compactMap { $0.headers["apns-id"] }
            #expect(ids.count == count, "one request per job")
            #expect(Set(ids).count == count)
            #expect(
                delivered.allSatisfy { $0 > 0 } && delivered.reduce(0, +) == count,
                "both workers took jobs: \(delivered)"
            )
        }
    }

    @Test("/healthz, /readyz and /metrics: sends by status, reason and trap id, latency, queue gauges; no tokens")
    func metricsAndHealth() async throws {
        try await DaemonFixture.run { f in
            let gone = DaemonFixture.token(31)
            f.simulator.script(gone, .unregistered(timestampMs: 1_700_000_000_000))
            let worker = try f.startWorker()
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}' FROM generate_series(1, 40) AS g
                """
            )
            try await f.waitUntil(.seconds(30), "all terminal") { try await f.unfinished() == 0 }
            #expect(try await f.get(worker, "/healthz").0 == 200)
            #expect(try await f.get(worker, "/readyz").0 == 200)
            let (status, metrics) = try await f.get(worker, "/metrics")
            #expect(status == 200)
            #expect(metrics.contains("push_sends_total{"))
            #expect(metrics.contains(#"status="200""#))
            #expect(metrics.contains(#"reason="Unregistered""#) && metrics.contains(#"trap="MS020""#))
            #expect(metrics.contains("push_attempt_latency_seconds"))
            #expect(metrics.contains(#"push_outcomes_total{outcome="delivered"} 39"#))
            #expect(!metrics.contains(gone), "no device token in metrics")
            #expect(metrics.contains("push_worker_ready 1"))
            #expect(
                metrics.contains(#"push_dead_letters_total{platform="apns",reason="Unregistered",trap="MS020"} 1"#),
                "the final attempt's trap: \(metrics)"
            )
            #expect(try await f.get(worker, "/nope").0 == 404)
            // The container health check: the real CLI against the real endpoint.
            let port = try await f.metricsPort(worker)
            let alive = try await f.cli(["healthcheck", "--port", "\(port)"])
            #expect(alive.status == 0 && alive.output.contains("/healthz: ok"), "\(alive.output)")
            #expect(try await f.cli(["healthcheck", "--port", "\(port)", "--ready"]).status == 0)
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
            let stopped = try await f.cli(["healthcheck", "--port", "\(port)"])
            #expect(
                stopped.status == 1 && stopped.output.contains("cannot connect"),
                "a stopped worker fails the check: \(stopped.output)"
            )
        }
    }

    @Test(
        "a config file names several credentials; each job is signed by its credential's key; one no worker has is never claimed, then dead-lettered MS028"
    )
    func severalCredentials() async throws {
        let second = try SimulatorCredentials.generate(
            in: FileManager.default.temporaryDirectory.appendingPathComponent("cred-b-\(UUID().uuidString)").path,
            teamID: "TEAMBBBBBB",
            keyID: "KEYBBBBBBB"
        )
        try await DaemonFixture.run(simulator: { $0.keys[second.keyID] = second.trustedKey }) { f in
            let config = f.directory + "/config.json"
            try """
            {"credentials": {
              "default": {"team_id": "\(f.credentials.teamID)", "key_id": "\(f.credentials.keyID)", "key_path": "\(f.keyPath)"},
              "brand-b": {"team_id": "\(second.teamID)", "key_id": "\(second.keyID)", "key_path": "\(second.keyPath)"}
            }}
            """.write(toFile: config, atomically: true, encoding: .utf8)
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, credential) VALUES
                ('com.example.app', '\(DaemonFixture.token(1))', '{"aps":{}}', 'default'),
                ('com.example.app', '\(DaemonFixture.token(2))', '{"aps":{}}', 'brand-b'),
                ('com.example.app', '\(DaemonFixture.token(3))', '{"aps":{}}', 'nobody')
                """
            )
            // The config file alone: no APNS_* keys in the environment.
            let worker = try ChildProcess.start(
                DaemonFixture.binary,
                [
                    "run", "--worker-id", "cfg", "--config", config, "--apns-endpoint",
                    "https://localhost:\(f.simulator.port)",
                    "--apns-ca-file", f.caFile, "--poll-interval-ms", "200", "--no-metrics", "--log-level", "info",
                    "--log-format", "json",
                    "--credential-wait", "3s",
                ],
                environment: ["DATABASE_URL": f.db.url.connectionString],
                outputPath: f.directory + "/cfg.log"
            )
            f.children.add(worker)
            try await f.waitUntil(.seconds(30), "two delivered") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 2
            }
            let keyOf = Dictionary(
                f.simulator.requests.compactMap { r in r.deviceToken.map { ($0, r.tokenKeyID ?? "") } },
                uniquingKeysWith: { a, _ in a }
            )
            #expect(keyOf[DaemonFixture.token(1)] == f.credentials.keyID)
            #expect(keyOf[DaemonFixture.token(2)] == second.keyID)
            #expect(keyOf[DaemonFixture.token(3)] == nil, "no request for a credential with no key")
            // Only claim what you can sign: the job waits unclaimed (no attempt used), then, with no live
            // worker holding its credential after --credential-wait, it is dead-lettered with MS028.
            try await f.waitUntil(.seconds(20), "the unknown credential's job dead-lettered") {
                try await f.db.int64(
                    "SELECT count(*) FROM push.dead_jobs WHERE credential = 'nobody' AND reason = 'CredentialsMissing' AND 'MS028' = ANY (trap_ids) AND attempts = 0"
                ) == 1
            }
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.dead_jobs WHERE credential = 'nobody' AND error LIKE '%no running worker has a signing key for credential ''nobody''%'"
                ) == 1
            )
            #expect(worker.output.contains("no running worker can sign for (MS028)"), "one clear error line")
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
            // --log-format json: one object per line, job lines carry the token's fingerprint, never the token.
            let lines = worker.output.split(separator: "\n").filter { $0.hasPrefix("{") }
            #expect(lines.count >= 2)
            #expect(lines.allSatisfy { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) is [String: Any] })
            #expect(!(1...3).contains { worker.output.contains(DaemonFixture.token($0)) })
        }
    }

    @Test("SIGTERM waits for a send in flight; a second SIGTERM exits at once, leaving the job to the reaper")
    func secondSignal() async throws {
        try await DaemonFixture.run { f in
            let token = DaemonFixture.token(5)
            f.simulator.script(token, .hang)
            let worker = try f.startWorker(
                "w",
                ["--shutdown-grace", "60s", "--request-timeout-ms", "30000", "--lease", "60s"]
            )
            try await f.db.execute(
                "INSERT INTO push.jobs (topic, device_token, payload) VALUES ('com.example.app', '\(token)', '{\"aps\":{}}')"
            )
            try await f.waitUntil(.seconds(30), "the request in flight") {
                f.simulator.requests.contains { $0.deviceToken == token }
            }
            worker.signal(SIGTERM)
            try await Task.sleep(for: .milliseconds(500))
            #expect(kill(worker.pid, 0) == 0, "still draining: the send is in flight")
            let clock = ContinuousClock()
            let start = clock.now
            worker.signal(SIGTERM)
            #expect(worker.wait() == 130, "\(worker.output.suffix(1500))")
            #expect(clock.now - start < .seconds(5))
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'running' AND locked_by = 'w'") == 1,
                "left running for the reaper, same apns_id"
            )
        }
    }

    @Test("a dead letter replayed with push-worker dead replay is delivered with its original apns_id")
    func replay() async throws {
        try await DaemonFixture.run { f in
            let token = DaemonFixture.token(77)
            f.simulator.script(token, .respond(status: 400, reason: "BadTopic"))
            let id = try await f.db.int64(
                "INSERT INTO push.jobs (topic, device_token, payload) VALUES ('com.example.app', '\(unescaped: token)', '{\"aps\":{\"alert\":\"hi\"}}') RETURNING id"
            )
            let worker = try f.startWorker()
            try await f.waitUntil(.seconds(30), "dead-lettered") {
                try await f.db.int64("SELECT count(*) FROM push.dead_jobs") == 1
            }
            f.simulator.script(token, .respond(status: 200, reason: nil))
            let replay = try await f.cli(["dead", "replay", String(id)])
            #expect(replay.status == 0, "\(replay.output)")
            try await f.waitUntil(.seconds(30), "delivered after replay") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 1
            }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
            let ids = f.simulator.requests.filter { $0.deviceToken == token }.map { $0.headers["apns-id"] ?? "" }
            #expect(ids.count == 2 && Set(ids).count == 1, "the replay reused the apns-id")
        }
    }
}

extension AsyncSequence where Self: Sendable {
    func collect() async throws -> [Element] {
        var values: [Element] = []
        for try await value in self { values.append(value) }
        return values
    }
}
