import APNsSimulator
import Foundation
import PostgresNIO
import PushProcess
import PushQueue
import Testing

/// The fleet-wide controls end to end, with the real binary and the simulator's request record.
@Suite("Flow control: coalescing, dead tokens, pauses, rate limits, fair share")
struct FlowControlDaemonTests {
    static func stop(_ workers: [ChildProcess.Running]) {
        for worker in workers { worker.signal(SIGTERM) }
        for worker in workers { worker.reap() }
    }

    @Test("coalesce_key: exactly the newest of each key is sent, with one worker and with two racing")
    func coalescing() async throws {
        try await DaemonFixture.run { f in
            var values: [String] = []
            for n in 1...10 {
                let key = n <= 5 ? "'activity-a'" : n <= 8 ? "'activity-b'" : "NULL"
                values.append(
                    "('com.example.app', '\(DaemonFixture.token(n))', '{\"aps\":{\"alert\":\"\(n)\"}}', \(key))"
                )
            }
            let ids = try await f.db.int64s(
                "INSERT INTO push.jobs (topic, device_token, payload, coalesce_key) VALUES \(unescaped: values.joined(separator: ",")) RETURNING id"
            )
            let worker = try f.startWorker("one")
            try await f.waitUntil(.seconds(30), "every job delivered or superseded") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state IN ('pending', 'running')") == 0
            }
            Self.stop([worker])
            let sent = f.simulator.requests.compactMap(\.deviceToken)
            #expect(
                Set(sent) == Set([5, 8, 9, 10].map(DaemonFixture.token)) && sent.count == 4,
                "exactly 4 requests, the newest of each key: \(sent.count)"
            )
            let superseded = try await f.db.client.query(
                "SELECT id, superseded_by FROM push.jobs WHERE state = 'superseded' ORDER BY id"
            ).decode((Int64, Int64).self).collect()
            #expect(superseded.map(\.0) == [ids[0], ids[1], ids[2], ids[3], ids[5], ids[6]])
            #expect(superseded.allSatisfy { [ids[4], ids[7]].contains($0.1) })
            #expect(try await f.db.int64("SELECT count(*) FROM push.dead_jobs") == 0, "never dead letters")
            let stats = try await f.cli(["stats"])
            #expect(stats.output.contains("superseded 6"), "\(stats.output)")

            // Two workers, 50 keys × 20 jobs inserted before either starts: exactly 50 requests.
            f.simulator.clearRequests()
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, coalesce_key)
                SELECT 'com.example.app', lpad(to_hex(1000 + g), 64, '0'), '{"aps":{"alert":"x"}}', 'race-' || (g % 50)
                  FROM generate_series(1, 1000) g
                """
            )
            let workers = [try f.startWorker("race-1"), try f.startWorker("race-2")]
            try await f.waitUntil(.seconds(30), "the race drained") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state IN ('pending', 'running')") == 0
            }
            Self.stop(workers)
            #expect(f.simulator.requests.count == 50, "\(f.simulator.requests.count) requests for 50 keys")
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE coalesce_key LIKE 'race-%' AND state = 'superseded'"
                ) == 950
            )
            try await FaultTests.assertInvariants(f, jobs: 1010, diedWorkers: [])
        }
    }

    @Test("a token invalidated after the job was enqueued: dead letter TokenInvalidated, no request; before: sent")
    func deadTokens() async throws {
        try await DaemonFixture.run { f in
            let (died, reborn) = (DaemonFixture.token(77), DaemonFixture.token(78))
            try await f.db.execute(
                """
                INSERT INTO push.invalid_tokens (device_token, topic, environment, reason, invalidated_at, job_id)
                VALUES ('\(reborn)', 'com.example.app', 'production', 'Unregistered', now() - interval '1 day', 0)
                """
            )
            let ids = try await f.db.int64s(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                VALUES ('com.example.app', '\(unescaped: died)', '{"aps":{"alert":"a"}}'),
                       ('com.example.app', '\(unescaped: reborn)', '{"aps":{"alert":"b"}}')
                RETURNING id
                """
            )
            try await f.db.execute(
                """
                INSERT INTO push.invalid_tokens (device_token, topic, environment, reason, invalidated_at, job_id)
                VALUES ('\(died)', 'com.example.app', 'production', 'Unregistered', now() + interval '1 second', 0)
                """
            )
            let worker = try f.startWorker("tokens")
            try await f.waitUntil(.seconds(30), "both jobs finished") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state IN ('pending', 'running')") == 0
            }
            Self.stop([worker])
            #expect(f.simulator.requests.compactMap(\.deviceToken) == [reborn], "no request for the dead token")
            let dead = try await f.db.client.query(
                "SELECT reason, array_to_string(trap_ids, ','), error FROM push.dead_jobs WHERE id = \(ids[0])"
            ).decode((String, String, String).self).collect()
            #expect(dead.first?.0 == "TokenInvalidated" && dead.first?.1 == "MS020", "\(dead)")
            #expect(dead.first?.2.contains("after the job was enqueued") == true)
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE id = \(ids[1]) AND state = 'delivered'") == 1
            )
            try await FaultTests.assertInvariants(f, jobs: 2, diedWorkers: [], rejectedBeforeSend: true)
        }
    }

    @Test("pause by topic: those jobs stay pending with no attempt while others are delivered; resume delivers them")
    func pauseAndResume() async throws {
        try await DaemonFixture.run { f in
            let paused = try await f.cli([
                "pause", "--topic", "com.example.paused", "--reason", "campaign copy is wrong",
            ])
            #expect(paused.status == 0, "\(paused.output)")
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT CASE WHEN g % 2 = 0 THEN 'com.example.paused' ELSE 'com.example.app' END,
                       lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"x"}}'
                  FROM generate_series(1, 40) g
                """
            )
            let worker = try f.startWorker("pauser", ["--poll-interval-ms", "5000"])
            defer { Self.stop([worker]) }
            try await f.waitUntil(.seconds(30), "the other topic delivered") {
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE topic = 'com.example.app' AND state = 'delivered'"
                )
                    == 20
            }
            try await Task.sleep(for: .milliseconds(500))
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE topic = 'com.example.paused' AND state = 'pending' AND attempts = 0"
                ) == 20
            )
            #expect(!f.simulator.requests.contains { $0.headers["apns-topic"] == "com.example.paused" })
            let listed = try await f.cli(["pauses", "--json"])
            let pauses = try JSONSerialization.jsonObject(with: Data(listed.output.utf8)) as? [[String: Any]]
            #expect(
                pauses?.count == 1 && pauses?.first?["topic"] as? String == "com.example.paused",
                "\(listed.output)"
            )
            #expect(pauses?.first?["reason"] as? String == "campaign copy is wrong")
            #expect(pauses?.first?["pending_jobs"] as? Int == 20)
            // The elected worker publishes the pause with its reason (after its first heartbeat).
            try await f.waitUntil(.seconds(20), "the pause on /metrics") {
                let body = try await f.get(worker, "/metrics").1
                return body.split(separator: "\n").contains {
                    $0.hasPrefix("push_pause_age_seconds{") && $0.contains(#"topic="com.example.paused""#)
                        && $0.contains(#"reason="campaign copy is wrong""#)
                }
            }

            // Resume: NOTIFY wakes the worker (its poll interval is 5 s): delivered within a few seconds.
            let resumedAt = ContinuousClock.now
            let resumed = try await f.cli(["resume", "--topic", "com.example.paused"])
            #expect(resumed.status == 0, "\(resumed.output)")
            try await f.waitUntil(.seconds(10), "the paused topic delivered after resume") {
                try await f.unfinished() == 0
            }
            #expect(ContinuousClock.now - resumedAt < .seconds(4), "resume reached the worker without a restart")
            #expect(try await f.cli(["resume", "--topic", "com.example.paused"]).status == 1, "nothing left to resume")
            try await FaultTests.assertInvariants(f, jobs: 40, diedWorkers: [])
        }
    }

    @Test(
        "a 50/s limit with burst 10 over two workers: rate + burst in any second where the requests leave, once the free topic is done and over the run; other topics unaffected"
    )
    func rateLimit() async throws {
        try await DaemonFixture.run { f in
            let set = try await f.cli([
                "limits", "set", "--topic", "com.example.limited", "--per-second", "50", "--burst", "10",
            ])
            #expect(set.status == 0, "\(set.output)")
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.limited', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"x"}}' FROM generate_series(1, 300) g
                """
            )
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.free', 'f' || lpad(to_hex(g), 63, '0'), '{"aps":{"alert":"x"}}' FROM generate_series(1, 300) g
                """
            )
            let workers = [try f.startWorker("limit-1"), try f.startWorker("limit-2")]
            defer { Self.stop(workers) }
            try await f.waitUntil(.seconds(30), "the free topic delivered") {
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE topic = 'com.example.free' AND state = 'delivered'"
                )
                    == 300
            }
            try await f.waitUntil(.seconds(30), "the limited topic delivered") { try await f.unfinished() == 0 }
            let times = f.simulator.requests.filter { $0.headers["apns-topic"] == "com.example.limited" }.map(
                \.receivedAt.timeIntervalSince1970
            ).sorted()
            #expect(times.count == 300)
            // Where the requests leave: each delivered job's last_attempt_at, when its worker wrote the request
            // (the fleet harness measures the same). The project's promise is the limit held there. Times are
            // seconds after the first request of either topic left.
            func leaving(_ topic: String) async throws -> [Double] {
                try await f.db.client.query(
                    """
                    SELECT extract(epoch FROM j.last_attempt_at - f.first)::float8
                      FROM push.jobs AS j, (SELECT min(last_attempt_at) AS first FROM push.jobs) AS f
                     WHERE j.topic = \(topic) ORDER BY 1
                    """
                ).decode(Double.self).collect()
            }
            let left = try await leaving("com.example.limited")
            let free = try await leaving("com.example.free")
            #expect(left.count == 300 && free.count == 300)
            let (freeDone, limitedDone) = (free.last ?? 0, left.last ?? 0)
            /// The most requests in any window of `seconds`, among `times` from `from` on.
            func worstWindow(_ times: [Double], _ seconds: Double, from: Double = -.infinity) -> Int {
                let after = times.filter { $0 >= from }
                var (worst, low) = (0, 0)
                for high in after.indices {
                    while after[high] - after[low] >= seconds { low += 1 }
                    worst = max(worst, high - low + 1)
                }
                return worst
            }
            // Rate + burst in any second where the requests leave, once the free topic is done and over the
            // whole run. Where they arrive is printed, not held: the in-process simulator shares two cores with
            // both workers, Postgres and, when the suite runs in parallel, other tests' workers, and a parallel
            // run saw it read nothing for 2 s and then 119 requests in 250 ms (the workers had sent 52 in
            // that second, as the limit says).
            let steady = worstWindow(left, 1, from: freeDone)
            let (left1, left5) = (worstWindow(left, 1), worstWindow(left, 5))
            let (worst1, worst5) = (worstWindow(times, 1), worstWindow(times, 5))
            print(
                "rate limit: where requests leave, worst 1-second window \(steady) once the free topic was done, \(left1) over the whole run, worst 5-second window \(left5); where they arrive, \(worst1) and \(worst5) (limit 50/s, burst 10); the limited topic's last request left at \(limitedDone) s, the free topic's at \(freeDone) s"
            )
            #expect(
                steady <= 60,
                "a 1-second window held \(steady) requests leaving the workers after the free topic was done"
            )
            #expect(left1 <= 60, "a 1-second window held \(left1) requests leaving the workers")
            #expect(left5 <= 260, "a 5-second window held \(left5) requests leaving the workers")
            // Arrivals over 5 s: the simulator's reading stalls shift requests between seconds but cannot add
            // any: what arrives within 5 s left within 5 s plus the stall (271 in the run that read nothing for
            // 2 s; 294 in a parallel run whose workers sent 250 in any 5 s). An independent check of the
            // workers' own times, allowing a 2 s stall.
            let left7 = worstWindow(left, 7)
            #expect(worst5 <= left7, "a 5-second window held \(worst5) arriving requests; \(left7) left in any 7 s")
            #expect(limitedDone >= 5, "300 jobs at 50/s take about 6 s to leave, not \(limitedDone)")
            #expect(freeDone < limitedDone / 2, "the free topic is not held back by the limited one")
            let metrics = try await f.get(workers[0], "/metrics").1 + (try await f.get(workers[1], "/metrics").1)
            #expect(metrics.contains("push_rate_limited_claims_total"))
            try await FaultTests.assertInvariants(f, jobs: 600, diedWorkers: [])
        }
    }

    @Test(
        "jobs cancel: a rate-limited job a worker holds for its slot is withdrawn and never sent; a waiting one is never claimed"
    )
    func cancelHeldAndWaiting() async throws {
        try await DaemonFixture.run { f in
            // One every 4 s, burst 2: the claim takes the first two (now and in 4 s); the third waits.
            let limit = try await f.cli([
                "limits", "set", "--topic", "com.example.app", "--per-second", "0.25", "--burst", "2",
            ])
            #expect(limit.status == 0, "\(limit.output)")
            try await f.insertAlerts(3)
            let worker = try f.startWorker("w", ["--log-level", "error"])
            try await f.waitUntil(.seconds(20), "the first request sent, the second held for its slot") {
                // The first one's outcome recorded (a request in flight when cancelled would complete), the
                // second held for its slot.
                let running = try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'running'")
                let delivered = try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'")
                return f.simulator.requests.count == 1 && delivered == 1 && running >= 1
            }
            let held = try await f.db.int64s("SELECT id FROM push.jobs WHERE state = 'running' ORDER BY id")
            let waiting = try await f.db.int64s("SELECT id FROM push.jobs WHERE state = 'pending' ORDER BY id")
            let cancelled = try await f.cli(["jobs", "cancel"] + (held + waiting).map(String.init))
            #expect(cancelled.status == 0 && cancelled.output.contains("held by a worker"), "\(cancelled.output)")
            // Past the held job's slot: nothing more was sent, and the jobs stay cancelled.
            try await Task.sleep(for: .seconds(6))
            #expect(f.simulator.requests.count == 1, "a cancelled job was sent")
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'cancelled'")
                    == Int64(held.count + waiting.count)
            )
            let shown = try await f.cli(["jobs", "show", "\(held[0])"])
            #expect(shown.output.contains("cancelled"), "\(shown.output)")
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
            try await FaultTests.assertInvariants(f, jobs: 3, diedWorkers: [])
        }
    }

    @Test(
        "jobs cancel: due jobs a worker holds while they wait for a stream are withdrawn one by one; the one in flight completes"
    )
    func cancelHeldInABatch() async throws {
        try await DaemonFixture.run(simulator: { $0.authenticatedMaxStreams = 1 }) { f in
            // One stream, each answer after 2 s: the batch's jobs wait in turn for the stream.
            for n in 1...8 { f.simulator.script(DaemonFixture.token(n), .latency(.seconds(2))) }
            try await f.insertAlerts(8)
            let worker = try f.startWorker("one-stream", ["--log-level", "error", "--connections", "1"])
            try await f.waitUntil(.seconds(20), "all eight held, the first in flight") {
                let running = try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'running'")
                return running == 8 && f.simulator.requests.count == 1
            }
            let ids = try await f.db.int64s("SELECT id FROM push.jobs ORDER BY id")
            let cancelled = try await f.cli(["jobs", "cancel"] + ids.map(String.init))
            #expect(cancelled.status == 0, "\(cancelled.output)")
            // The request in flight completes: its 200 is recorded (the job ends delivered).
            try await f.waitUntil(.seconds(20), "the first one's outcome") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 1
            }
            try await Task.sleep(for: .seconds(1))
            #expect(f.simulator.requests.count == 1, "cancelled jobs were sent: \(f.simulator.requests.count) requests")
            let states = try await f.db.client.query("SELECT state || ':' || attempts FROM push.jobs ORDER BY id")
                .decode(String.self).collect()
            #expect(states.filter { $0.hasPrefix("cancelled") }.count == 7, "\(states)")
            #expect(states.filter { $0.hasPrefix("delivered") }.count == 1, "\(states)")
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
            try await FaultTests.assertInvariants(f, jobs: 8, diedWorkers: [])
        }
    }

    @Test("fair share: 20,000 jobs of credential A, then 20 of B: B's go out in the next claim, not behind A's backlog")
    func fairShare() async throws {
        let second = try SimulatorCredentials.generate(
            in: FileManager.default.temporaryDirectory.appendingPathComponent("cred-fair-\(UUID().uuidString)").path,
            teamID: "TEAMFAIRBB",
            keyID: "KEYFAIRBBB"
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
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"a"}}' FROM generate_series(1, 20000) g
                """
            )
            let worker = try f.startWorker("fair", ["--config", config])
            defer { Self.stop([worker]) }
            try await f.waitUntil(.seconds(60), "A is draining") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") > 1000
            }
            let insertedAt = ContinuousClock.now
            let insertedDate = Date()
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, credential)
                SELECT 'com.example.app', 'b' || lpad(to_hex(g), 63, '0'), '{"aps":{"alert":"b"}}', 'brand-b' FROM generate_series(1, 20) g
                """
            )
            try await f.waitUntil(.seconds(30), "B delivered") {
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE credential = 'brand-b' AND state = 'delivered'"
                )
                    == 20
            }
            let recorded = ContinuousClock.now - insertedAt
            let aLeft = try await f.db.int64(
                "SELECT count(*) FROM push.jobs WHERE credential = 'default' AND state <> 'delivered'"
            )
            // Delivered: APNs answered 200 (the simulator's record); the row says so once the outcome is written.
            let answered = f.simulator.requests.filter { $0.deviceToken?.hasPrefix("b") == true && $0.status == 200 }
            let took = (answered.map(\.receivedAt).max() ?? .distantFuture).timeIntervalSince(insertedDate)
            print(
                "fair share: B's 20 jobs answered 200 within \(took) s of their INSERT and recorded within \(recorded), with \(aLeft) of A's still to go"
            )
            // The fair-share guarantee itself, independent of how fast this machine is: B's jobs were taken by
            // the first claims after their INSERT, so at most the batch under way then and the A jobs sharing
            // B's claim (two batches of 250) started between the INSERT and B's first start. (To B's last start,
            // a loaded machine let 512 through once: A's next claims go on while B's 20 requests are written.)
            let startedMeanwhile = try await f.db.int64(
                """
                SELECT count(*) FROM push.jobs
                 WHERE credential = 'default' AND first_attempt_at > (SELECT min(created_at) FROM push.jobs WHERE credential = 'brand-b')
                   AND first_attempt_at < (SELECT min(first_attempt_at) FROM push.jobs WHERE credential = 'brand-b')
                """
            )
            let claimedWithin = try await f.db.double(
                """
                SELECT extract(epoch FROM max(first_attempt_at - created_at))::float8 FROM push.jobs
                 WHERE credential = 'brand-b'
                """
            )
            let aLatencyMs = try await f.db.double(
                """
                SELECT coalesce(avg(latency_ms), 0)::float8 FROM push.jobs
                 WHERE credential = 'default' AND state = 'delivered' AND delivered_at > now() - interval '3 seconds'
                """
            )
            print(
                "fair share: B's jobs started within \(claimedWithin) s of their INSERT, \(startedMeanwhile) of A's started meanwhile; A's requests took \(Int(aLatencyMs)) ms each from stream to answer meanwhile"
            )
            #expect(
                startedMeanwhile <= 500,
                "B waited behind \(startedMeanwhile) of A's jobs, more than two claim batches"
            )
            #expect(claimedWithin < 1.5, "B's jobs were first attempted \(claimedWithin) s after their INSERT")
            // Delivery: the first claim after the INSERT, then two round trips on B's new connection (one request
            // alone while APNs checks the token, then the rest), each queued behind A's 500 sends in flight at the
            // debug-built stand-in (about 1 s each on these 2 cores, printed above). Under 2 s on this machine
            // most runs; CI's run took 2.6 s. A's remaining backlog would take ten times as long.
            #expect(answered.count == 20 && took < 5, "B waited \(took) s")
            #expect(aLeft > 0, "A was still draining: the test measured sharing, not an empty queue")
            // A is still draining (a debug worker takes minutes for 20,000): stop it and check what holds then.
            Self.stop([worker])
            #expect(try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'running'") == 0)
            var ids: [String: Set<String>] = [:]
            for request in f.simulator.requests {
                if let token = request.deviceToken { ids[token, default: []].insert(request.headers["apns-id"] ?? "") }
            }
            #expect(ids.values.allSatisfy { $0.count == 1 }, "one apns-id per job")
            #expect(f.simulator.faultCounters.okAnswers.values.allSatisfy { $0 == 1 }, "no 200 answered twice")
        }
    }
}
