import APNsSimulator
import Foundation
import Logging
import PostgresNIO
import PushProcess
import PushQueue
import PushQueueTesting
import Testing

/// The fleet at the shape users run it: the real binary, three workers, ten configured credentials, a backlog,
/// and neighbour events drawn from a printed seed while it drains: a producer transaction held open over the
/// in-flight apns_ids, one worker frozen (SIGSTOP) and let go, a rate limit set and cleared, a topic paused and
/// resumed over its backlog, keyed jobs whose older one commits late, (in some seeds) a worker killed, both
/// providers answering 503 for a while, a hot Android device over its own rate beside its credential's
/// neighbours, and the database turning read-only under the workers' one host name, then writable again.
/// Every run ends with the invariants: every job delivered, superseded or dead with a reason, none running;
/// no 200 answered twice unless a worker died; no older keyed job sent after a newer one's 200; each
/// limit held where the requests arrive; nothing of a paused topic sent while it was paused. A webhook takes
/// every dead, token_invalid and superseded outcome (a loopback receiver that checks each signature): none of
/// its deliveries is lost, whatever the neighbours did.
///
/// Quick by default (2 fixed seeds, 3,000 jobs); `PUSH_LONG_TESTS=1`: 20 drawn seeds of 100,000 jobs;
/// `PUSH_FLEET_SEEDS=a,b` replays seeds.
@Suite("The fleet under neighbour events from a printed seed")
struct FleetHarnessTests {
    static let long = FaultTests.long

    /// The seeds: `PUSH_FLEET_SEEDS=a,b` replays them; two fixed ones by default (one kills a worker), so a red
    /// run replays; 20 drawn in the long form. Each is a test case of its own, so the seeds run side by side.
    static let seeds: [UInt64] = {
        if let given = ProcessInfo.processInfo.environment["PUSH_FLEET_SEEDS"] {
            return given.split(separator: ",").compactMap { UInt64($0) }
        }
        return Self.long ? (1...20).map { _ in UInt64.random(in: 1...999_999) } : [11, 64_141]
    }()

    @Test(
        "fleet harness: open producer transaction, frozen worker, limits, pauses, late keyed commits, revived superseded jobs, kill -9, a provider outage, a hot device, a read-only primary behind one name",
        arguments: Self.seeds
    )
    func fleet(seed: UInt64) async throws {
        print("fleet seed \(seed) (PUSH_FLEET_SEEDS=\(seed) replays it)")
        try await Self.run(seed: seed, jobs: Self.long ? 100_000 : 3_000)
    }

    @Test(
        "one worker of two frozen 12 s (SIGSTOP) with its requests in flight, answered while it was frozen: no apns-id answered 200 twice, every job delivered"
    )
    func frozenWorker() async throws {
        try await DaemonFixture.run(
            expected: .seconds(15),
            mostlyWaiting: true,
            simulator: { configuration in
                // Every answer takes 2 s: the requests are in flight when the worker freezes, and answered then.
                configuration.faults.slowShare = 1
                configuration.faults.slowLatency = .seconds(2)
                configuration.faults.okThenResetShare = 0.05
            }
        ) { f in
            let count = 1_000
            try await f.insertAlerts(count)
            let options = ["--log-level", "error", "--concurrency", "500", "--request-timeout-ms", "5000"]
            let frozen = try f.startWorker("frozen", options)
            try await f.waitUntil(.seconds(60), "the first worker's requests in flight") {
                f.simulator.requests.count >= 300
            }
            frozen.signal(SIGSTOP)
            let inFlight = f.simulator.requests.count
            let other = try f.startWorker("other", options)
            try await Task.sleep(for: .seconds(12))
            frozen.signal(SIGCONT)
            try await f.waitUntil(.seconds(180), "every job terminal") { try await f.unfinished() == 0 }
            for worker in [frozen, other] {
                worker.signal(SIGTERM)
                #expect(worker.wait() == 0)
            }
            let summary = try await FaultTests.assertInvariants(f, jobs: count, diedWorkers: [])
            let twice = f.simulator.faultCounters.okAnswers.values.filter { $0 > 1 }.count
            #expect(twice == 0)
            print(
                "frozen worker: \(inFlight) requests had arrived when it froze for 12 s; \(twice) apns-ids answered 200 twice; \(f.simulator.faultCounters.okThenResets) 200s reset before END_STREAM; \(summary)"
            )
        }
    }

    @Test(
        "TopicDisallowed holds only that topic of the credential: its jobs stay pending with no attempt counted while the credential's other topic is delivered"
    )
    func topicDisallowedHoldsOneTopic() async throws {
        try await DaemonFixture.run(simulator: { $0.allowedTopics = ["com.example.app"] }) { f in
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT CASE WHEN g % 2 = 0 THEN 'com.example.app' ELSE 'com.other.app' END,
                       lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}'
                  FROM generate_series(1, 400) AS g
                """
            )
            let worker = try f.startWorker("w1", ["--log-level", "error"])
            try await f.waitUntil(.seconds(60), "the allowed topic delivered") {
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE topic = 'com.example.app' AND state = 'delivered'"
                ) == 200
            }
            // Requests of the refused topic already written when the first TopicDisallowed came back are answered
            // and requeued uncounted; after that the topic is held: no more requests while its pause lasts.
            let refused = { f.simulator.requests.filter { $0.headers["apns-topic"] == "com.other.app" }.count }
            let before = refused()
            try await Task.sleep(for: .seconds(3))
            let refusedRequests = refused()
            #expect(refusedRequests == before, "the refused topic kept being sent: \(before) then \(refusedRequests)")
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE topic = 'com.other.app' AND state = 'pending' AND attempts = 0"
                ) == 200
            )
            #expect(try await f.db.int64("SELECT count(*) FROM push.dead_jobs") == 0)
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
            #expect(worker.output.contains("for topic 'com.other.app' (TopicDisallowed)"))
            print(
                "TopicDisallowed: 200 of the allowed topic delivered; \(refusedRequests) requests of the refused topic (those in flight when the first refusal came back), then none for 3 s; its 200 jobs held, no attempt counted"
            )
        }
    }

    /// What one seed does, drawn before the run so the printed seed replays it.
    struct Plan: CustomStringConvertible {
        var producerHoldAt: Duration
        var producerHoldFor: Duration
        var freezeAt: Duration
        var freezeFor: Duration
        var limitAt: Duration
        var limitFor: Duration
        var perSecond: Int
        var burst: Int
        var pauseAt: Duration
        var pauseFor: Duration
        var lateCommitAt: Duration
        var killAt: Duration?
        var reviveAt: Duration
        /// The idle spell: once the backlog is drained, the queue idles this long, is analyzed (as autovacuum
        /// does after a large drain), and a burst of `burstJobs` over `burstTopics` topics arrives.
        var idleFor: Duration
        var burstTopics: Int
        /// A provider outage: the simulator answers every APNs and FCM send 503, after the limit's window.
        var outageAt: Duration
        var outageFor: Duration
        /// A hot Android device (QUOTA_EXCEEDED on every send) and its credential's neighbours, after the outage.
        var hotAt: Duration
        /// The database turns read-only under the burst after the idle spell (a primary demoted behind one
        /// name), then writable again.
        var readOnlyFor: Duration

        init(seed: UInt64) {
            var r = SeededGenerator(seed: seed)
            func ms(_ range: ClosedRange<Int64>) -> Duration { .milliseconds(Int64.random(in: range, using: &r)) }
            self.producerHoldAt = ms(200...1_500)
            self.producerHoldFor = ms(3_000...8_000)
            self.freezeAt = ms(500...2_500)
            self.freezeFor = ms(7_000...12_000)
            self.limitAt = ms(0...1_000)
            self.limitFor = ms(4_000...8_000)
            self.perSecond = Int.random(in: 20...80, using: &r)
            self.burst = Int.random(in: 1...10, using: &r)
            self.pauseAt = ms(0...1_500)
            self.pauseFor = ms(5_000...9_000)
            self.lateCommitAt = ms(300...2_000)
            self.killAt = Bool.random(using: &r) ? ms(1_000...4_000) : nil
            self.reviveAt = ms(500...3_000)
            self.idleFor = ms(200...2_000)
            self.burstTopics = [1, 50, 500, 2_000].randomElement(using: &r)!
            // Drawn after the earlier fields, so the seeds of before still replay their first events.
            self.outageAt = self.limitAt + self.limitFor + ms(0...2_000)
            self.outageFor = ms(3_000...12_000)
            self.hotAt = self.outageAt + self.outageFor + ms(500...2_000)
            self.readOnlyFor = ms(3_000...8_000)
        }

        var description: String {
            "producer holds its transaction at \(self.producerHoldAt) for \(self.producerHoldFor); worker b frozen at \(self.freezeAt) for \(self.freezeFor); limit \(self.perSecond)/s burst \(self.burst) at \(self.limitAt) for \(self.limitFor); pause at \(self.pauseAt) for \(self.pauseFor); late keyed commit at \(self.lateCommitAt); superseders die and the superseded are revived at \(self.reviveAt); "
                + (self.killAt.map { "worker c killed at \($0)" } ?? "no worker killed")
                + "; after the drain, idle \(self.idleFor), ANALYZE, a burst over \(self.burstTopics) topics"
                + "; providers answer 503 at \(self.outageAt) for \(self.outageFor); a hot Android device at \(self.hotAt); the database read-only under the burst for \(self.readOnlyFor)"
        }
    }

    /// What a neighbour did, for the checks at the end.
    enum Event: Sendable {
        case burst(Int)
        case limit(Date, Date, Int)
        case pause(Date, Date)
        case late([Int64], [Int64])
        case revived(Int)
        case outage(Date, Date)
        case hot(Int, Duration)
        case none
    }

    static let hotToken = "hot:APA91bH-token"

    static let limitedTopic = "com.example.limited"
    static let pausedTopic = "com.example.paused"

    /// Recipients in the backlog, two live devices each.
    static let recipients = 100

    static func run(seed: UInt64, jobs count: Int) async throws {
        let plan = Plan(seed: seed)
        print("seed \(seed): \(plan)")
        // FCM too: every fourth backlog job is Android, sent with the FCM credential `default`
        // (FCM_SERVICE_ACCOUNT_PATH) beside the ten APNs credentials of the config file.
        try await DaemonFixture.run(fcm: true, expected: .seconds(60)) { f in
            // Ten configured credentials, all with the fixture's key; most of the backlog is c0's.
            var credentials: [String: [String: String]] = [:]
            for n in 0..<10 {
                credentials["c\(n)"] = [
                    "team_id": f.credentials.teamID, "key_id": f.credentials.keyID, "key_path": f.keyPath,
                ]
            }
            let config = f.directory + "/fleet.json"
            try JSONSerialization.data(withJSONObject: ["credentials": credentials]).write(
                to: URL(fileURLWithPath: config)
            )
            // 80 % c0, the rest spread; 5 % paused topic, 10 % keyed (50 keys); a quarter Android (credential
            // default, FCM's). The limited topic's jobs come with its limit, so each of its requests was claimed
            // under it.
            try await f.db.execute(
                """
                INSERT INTO push.jobs (platform, topic, device_token, payload, credential, coalesce_key, priority)
                SELECT CASE WHEN g % 4 = 2 THEN 'fcm' ELSE 'apns' END,
                       CASE WHEN g % 20 = 7 THEN '\(Self.pausedTopic)' ELSE 'com.example.app' END,
                       CASE WHEN g % 4 = 2 THEN 'fKx' || g || ':APA91bH-token' ELSE lpad(to_hex(g), 64, '0') END,
                       (CASE WHEN g % 4 = 2 THEN '{"notification":{"title":"hi"}}' ELSE '{"aps":{"alert":"hi"}}' END)::jsonb,
                       CASE WHEN g % 4 = 2 THEN 'default' WHEN g % 5 = 0 THEN 'c' || (g % 10) ELSE 'c0' END,
                       CASE WHEN g % 10 = 1 THEN 'key-' || (g % 50) END,
                       CASE WHEN g % 3 = 0 THEN 5 ELSE 10 END
                  FROM generate_series(1, \(count)) AS g
                """
            )
            var inserted = count
            // People, not tokens: 100 recipients with two live devices each (tokens apart from the backlog's),
            // their jobs fanned out by whichever worker claims them; the children are counted as jobs.
            try await f.db.execute(
                """
                INSERT INTO push.devices (recipient, topic, token)
                SELECT 'person:' || r, 'com.example.app', lpad(to_hex(16000000 + r * 4 + d), 64, '0')
                  FROM generate_series(1, \(Self.recipients)) AS r, generate_series(0, 1) AS d
                """
            )
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, recipient, payload, credential)
                SELECT 'com.example.app', 'person:' || r, '{"aps":{"alert":"hi"}}', 'c' || (r % 10)
                  FROM generate_series(1, \(Self.recipients)) AS r
                """
            )
            inserted += Self.recipients * 2
            let secret = try WebhookDaemonTests.secret(in: f.directory)
            let receiver = try await WebhookReceiver.start(in: f.directory, secretFile: secret, seed: seed, delay: 0)
            defer { receiver.stop() }
            let hook = try await f.cli([
                "webhooks", "add", "http://127.0.0.1:\(receiver.port)/ok", "--events", "dead,token_invalid,superseded",
                "--secret-file", secret,
            ])
            #expect(hook.status == 0, "\(hook.output)")
            let options = [
                "--config", config, "--log-level", "notice", "--base-delay-ms", "50", "--max-delay-ms", "500",
                "--frozen-worker-wait", "60s", "--batch-size", "100", "--webhooks-allow-private",
                "--webhooks-per-hook", "16",
            ]
            let started = ContinuousClock.now
            let startedAt = Date()
            let a = try f.startWorker("a", options)
            let b = try f.startWorker("b", options)
            let c = try f.startWorker("c", options)
            var died: Set<String> = []
            let logger = Logger(label: "fleet")
            // The neighbours, each on its own schedule; each says what it did.
            var limitWindow: (Date, Date)?
            var pauseWindow: (Date, Date)?
            var lateKeys: [(older: Int64, newer: Int64)] = []
            var outageWindow: (Date, Date)?
            var hotNeighbours: Duration?
            let killAt = plan.killAt
            if killAt != nil { died.insert("c") }
            try await withThrowingTaskGroup(of: Event.self) { events in
                events.addTask {
                    // A producer's outbox re-enqueues what is in flight and leaves its transaction open.
                    try await Task.sleep(until: started + plan.producerHoldAt)
                    let producer = try await f.session(id: 1)
                    try await producer.query("BEGIN", logger: logger)
                    try await producer.query(
                        """
                        INSERT INTO push.jobs (topic, device_token, payload, apns_id)
                        SELECT topic, device_token, payload, apns_id FROM push.jobs WHERE state = 'running'
                        ON CONFLICT (apns_id) DO NOTHING
                        """,
                        logger: logger
                    )
                    try await Task.sleep(for: plan.producerHoldFor)
                    try await producer.query("COMMIT", logger: logger)
                    try await producer.close()
                    return .none
                }
                events.addTask {
                    try await Task.sleep(until: started + plan.freezeAt)
                    b.signal(SIGSTOP)
                    try await Task.sleep(for: plan.freezeFor)
                    b.signal(SIGCONT)
                    return .none
                }
                events.addTask {
                    try await Task.sleep(until: started + plan.limitAt)
                    let set = try await f.cli([
                        "limits", "set", "--topic", Self.limitedTopic, "--per-second", "\(plan.perSecond)", "--burst",
                        "\(plan.burst)",
                    ])
                    #expect(set.status == 0, "\(set.output)")
                    let from = Date()
                    let limited = plan.perSecond * 10
                    try await f.db.execute(
                        """
                        INSERT INTO push.jobs (topic, device_token, payload, credential)
                        SELECT '\(Self.limitedTopic)', lpad(to_hex(3000000 + g), 64, '0'), '{"aps":{"alert":"hi"}}',
                               'c' || (g % 10)
                          FROM generate_series(1, \(limited)) AS g
                        """
                    )
                    try await Task.sleep(for: plan.limitFor)
                    let to = Date()
                    _ = try await f.cli(["limits", "clear", "--topic", Self.limitedTopic])
                    return .limit(from, to, limited)
                }
                events.addTask {
                    try await Task.sleep(until: started + plan.pauseAt)
                    let paused = try await f.cli(["pause", "--topic", Self.pausedTopic, "--reason", "fleet-harness"])
                    #expect(paused.status == 0, "\(paused.output)")
                    let from = Date()
                    try await Task.sleep(for: plan.pauseFor)
                    let to = Date()
                    _ = try await f.cli(["resume", "--topic", Self.pausedTopic])
                    return .pause(from, to)
                }
                events.addTask {
                    // Keyed jobs whose older one commits after the newer one was claimed.
                    try await Task.sleep(until: started + plan.lateCommitAt)
                    let producer = try await f.session(id: 2)
                    try await producer.query("BEGIN", logger: logger)
                    var olders: [Int64] = []
                    for try await id in try await producer.query(
                        """
                        INSERT INTO push.jobs (topic, device_token, payload, coalesce_key)
                        SELECT 'com.example.app', lpad(to_hex(1000000 + g), 64, '0'), '{"aps":{"alert":"old"}}', 'late-' || g
                          FROM generate_series(1, 20) AS g RETURNING id
                        """,
                        logger: logger
                    ).decode(Int64.self) {
                        olders.append(id)
                    }
                    let newers = try await f.db.int64s(
                        """
                        INSERT INTO push.jobs (topic, device_token, payload, coalesce_key)
                        SELECT 'com.example.app', lpad(to_hex(2000000 + g), 64, '0'), '{"aps":{"alert":"new"}}', 'late-' || g
                          FROM generate_series(1, 20) AS g RETURNING id
                        """
                    )
                    try await f.waitUntil(.seconds(60), "the newer keyed jobs claimed") {
                        try await f.db.int64(
                            "SELECT count(*) FROM push.jobs WHERE id = ANY ('{\(unescaped: newers.map(String.init).joined(separator: ","))}') AND state = 'pending'"
                        ) == 0
                    }
                    try await producer.query("COMMIT", logger: logger)
                    try await producer.close()
                    return .late(olders.sorted(), newers.sorted())
                }
                events.addTask {
                    // Ten keys whose newer job supersedes the older at its claim and then dies (APNs refuses its
                    // token); the operator revives the older ones, which are then sent.
                    try await Task.sleep(until: started + plan.reviveAt)
                    for g in 1...10 {
                        f.simulator.script(
                            DaemonFixture.token(0x500000 + g),
                            .respond(status: 400, reason: "BadDeviceToken")
                        )
                    }
                    let ids = try await f.db.int64s(
                        """
                        INSERT INTO push.jobs (topic, device_token, payload, coalesce_key)
                        SELECT 'com.example.app', lpad(to_hex(CASE WHEN n = 1 THEN 4194304 ELSE 5242880 END + g), 64, '0'),
                               '{"aps":{"alert":"revive"}}', 'revive-' || g
                          FROM generate_series(1, 10) AS g, generate_series(1, 2) AS n ORDER BY n, g RETURNING id
                        """
                    ).sorted()
                    let (olders, newers) = (Array(ids.prefix(10)), Array(ids.suffix(10)))
                    try await f.waitUntil(.seconds(120), "the newer keyed jobs dead") {
                        try await f.db.int64(
                            "SELECT count(*) FROM push.dead_jobs WHERE id = ANY ('{\(unescaped: newers.map(String.init).joined(separator: ","))}')"
                        ) == 10
                    }
                    let revive = try await f.cli(["jobs", "revive"] + olders.map(String.init))
                    #expect(revive.status == 0 && revive.output.contains("revived 10"), "\(revive.output)")
                    return .revived(20)
                }
                events.addTask {
                    // The idle spell: the backlog drains, the queue idles, its statistics are taken while
                    // nothing is pending (autovacuum's own ANALYZE after a large drain), then a burst arrives over
                    // many topics, some keyed. Claims planned for an empty queue must not stall the fleet.
                    try await f.waitUntil(.seconds(Self.long ? 900 : 240), "the backlog drained (seed \(seed))") {
                        try await f.db.int64(
                            "SELECT count(*) FROM push.jobs WHERE state IN ('pending', 'running') AND topic = 'com.example.app'"
                        ) == 0
                    }
                    // After the hot device's neighbours too: nothing but the workers writes from here on.
                    try await f.waitUntil(.seconds(240), "the hot device's neighbours delivered (seed \(seed))") {
                        try await f.db.int64(
                            "SELECT count(*) FROM push.jobs WHERE topic = 'com.example.hot' AND device_token LIKE 'neighbour%' AND state = 'delivered'"
                        ) == 200
                    }
                    try await Task.sleep(for: plan.idleFor)
                    if Self.long {
                        // The long form waits for autovacuum's own ANALYZE of the drained table (its default
                        // naptime is a minute), as the queue meets it in production; the quick form runs it.
                        let before = try await f.db.int64(
                            "SELECT coalesce(extract(epoch FROM last_autoanalyze) * 1000, 0)::bigint FROM pg_stat_user_tables WHERE relid = 'push.jobs'::regclass"
                        )
                        try await f.waitUntil(.seconds(300), "autovacuum analyzed push.jobs (seed \(seed))") {
                            try await f.db.int64(
                                "SELECT coalesce(extract(epoch FROM last_autoanalyze) * 1000, 0)::bigint FROM pg_stat_user_tables WHERE relid = 'push.jobs'::regclass"
                            ) > before
                        }
                    } else {
                        try await f.db.execute("ANALYZE push.jobs")
                    }
                    let burst = Self.long ? 20_000 : 2_000
                    try await f.db.execute(
                        """
                        INSERT INTO push.jobs (topic, device_token, payload, credential, coalesce_key)
                        SELECT 'com.example.tenant' || (g % \(plan.burstTopics)), lpad(to_hex(6000000 + g), 64, '0'),
                               '{"aps":{"alert":"burst"}}', 'c' || (g % 10),
                               CASE WHEN g % 10 = 3 THEN 'burst-' || (g % 100) END
                          FROM generate_series(1, \(burst)) AS g
                        """
                    )
                    // The primary behind the workers' one host name turns read-only under the burst (a failover
                    // demoting it), and after a while the name leads to a writable primary again: new sessions of
                    // the database are read-only and the workers' sessions are cut (as a proxy drops them), then
                    // it is lifted. Nothing else writes meanwhile (this test's reads go on).
                    let database =
                        try await f.db.client.query("SELECT current_database()").decode(String.self)
                        .collect().first ?? ""
                    try await f.db.execute(
                        "ALTER DATABASE \"\(database)\" SET default_transaction_read_only = on"
                    )
                    try await f.db.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name IN ('a', 'b', 'c')"
                    )
                    try await Task.sleep(for: plan.readOnlyFor)
                    try await f.db.execute(
                        "ALTER DATABASE \"\(database)\" RESET default_transaction_read_only"
                    )
                    // Liveness, not speed: a stalled fleet (claims running past their deadline) never gets here.
                    try await f.waitUntil(.seconds(120), "the burst after the idle spell claimed (seed \(seed))") {
                        try await f.db.int64(
                            "SELECT count(*) FROM push.jobs WHERE state = 'pending' AND topic LIKE 'com.example.tenant%'"
                        ) == 0
                    }
                    return .burst(burst)
                }
                events.addTask {
                    // A regional outage of both providers: every send answered 503 for a while.
                    try await Task.sleep(until: started + plan.outageAt)
                    f.simulator.setOutage(503)
                    let from = Date()
                    try await Task.sleep(for: plan.outageFor)
                    f.simulator.setOutage(nil)
                    return .outage(from, Date())
                }
                events.addTask {
                    // One Android device over its own rate, then its credential's neighbours: they go out at once.
                    try await Task.sleep(until: started + plan.hotAt)
                    f.simulator.script(Self.hotToken, .respond(status: 429, reason: "QUOTA_EXCEEDED"))
                    try await f.db.execute(
                        "INSERT INTO push.jobs (platform, topic, device_token, payload, expires_at) VALUES ('fcm', 'com.example.hot', '\(Self.hotToken)', '{\"data\":{\"a\":\"b\"}}', now() + interval '20 seconds')"
                    )
                    try await f.waitUntil(.seconds(60), "the hot device answered (seed \(seed))") {
                        f.simulator.requests.contains {
                            String(decoding: $0.body, as: UTF8.self).contains(Self.hotToken)
                        }
                    }
                    try await f.db.execute(
                        """
                        INSERT INTO push.jobs (platform, topic, device_token, payload)
                        SELECT 'fcm', 'com.example.hot', 'neighbour' || g || ':APA91bH-token', '{"data":{"a":"b"}}'
                          FROM generate_series(1, 200) AS g
                        """
                    )
                    let inserted = ContinuousClock.now
                    try await f.waitUntil(.seconds(120), "the hot device's neighbours delivered (seed \(seed))") {
                        try await f.db.int64(
                            "SELECT count(*) FROM push.jobs WHERE topic = 'com.example.hot' AND device_token LIKE 'neighbour%' AND state = 'delivered'"
                        ) == 200
                    }
                    return .hot(201, ContinuousClock.now - inserted)
                }
                if let killAt {
                    events.addTask {
                        try await Task.sleep(until: started + killAt)
                        kill(c.pid, SIGKILL)
                        return .none
                    }
                }
                for try await event in events {
                    switch event {
                    case .burst(let jobs): inserted += jobs
                    case .limit(let from, let to, let jobs):
                        limitWindow = (from, to)
                        inserted += jobs
                    case .pause(let from, let to): pauseWindow = (from, to)
                    case .late(let olders, let newers): lateKeys = Array(zip(olders, newers))
                    case .revived(let jobs): inserted += jobs
                    case .outage(let from, let to): outageWindow = (from, to)
                    case .hot(let jobs, let took):
                        inserted += jobs
                        hotNeighbours = took
                    case .none: break
                    }
                }
            }
            inserted += 40
            try await f.waitUntil(.seconds(Self.long ? 900 : 240), "every job terminal (seed \(seed))") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state IN ('pending', 'running')") == 0
            }
            try await f.waitUntil(.seconds(Self.long ? 600 : 120), "every webhook delivery made (seed \(seed))") {
                try await f.db.int64("SELECT count(*) FROM push.webhook_deliveries WHERE state <> 'delivered'") == 0
            }
            let elapsed = ContinuousClock.now - started
            for worker in [a, b] + (plan.killAt == nil ? [c] : []) {
                worker.signal(SIGTERM)
                #expect(worker.wait() == 0, "seed \(seed): a worker did not drain cleanly")
            }
            if plan.killAt != nil { c.reap() }
            let summary = try await FaultTests.assertInvariants(f, jobs: inserted, diedWorkers: died, seed: seed)
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE recipient IS NOT NULL AND state = 'fanned_out'"
                )
                    == Int64(Self.recipients),
                "seed \(seed): every recipient's job fanned out"
            )
            #expect(
                try await f.db.int64(
                    """
                    SELECT count(*) FROM push.jobs AS c JOIN push.jobs AS p ON p.id = c.parent_id
                     WHERE c.state = 'delivered' AND p.recipient LIKE 'person:%'
                    """
                ) == Int64(Self.recipients * 2),
                "seed \(seed): one delivered child per live device"
            )
            // The webhook: one delivery per dead letter, each taken by the receiver, every signature good.
            let hookRequests = receiver.requests
            let received = Set(hookRequests.compactMap(\.delivery))
            let deliveries = try await f.db.int64s("SELECT id FROM push.webhook_deliveries ORDER BY id")
            let lostDeliveries = deliveries.filter { !received.contains("\($0)") }
            #expect(lostDeliveries.isEmpty, "seed \(seed): webhook deliveries lost: \(lostDeliveries.prefix(5))")
            #expect(hookRequests.allSatisfy { $0.signed }, "seed \(seed): every webhook request signed")
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.webhook_deliveries WHERE event = 'dead'")
                    == (try await f.db.int64("SELECT count(*) FROM push.dead_jobs")),
                "seed \(seed): one dead delivery per dead letter"
            )
            let superseded = try await f.db.int64(
                "SELECT count(*) FROM push.webhook_deliveries WHERE event = 'superseded'"
            )
            print(
                "seed \(seed): webhook deliveries \(deliveries.count) (superseded \(superseded)), requests \(hookRequests.count), taken twice \(hookRequests.count - received.count), lost \(lostDeliveries.count)"
            )
            let deadReasons = try await f.db.client.query(
                "SELECT reason || ' ' || coalesce(left(error, 200), '') || ' x' || count(*) FROM push.dead_jobs WHERE reason <> 'BadDeviceToken' GROUP BY reason, left(error, 200) UNION ALL (SELECT 'history: ' || history::text FROM push.dead_jobs WHERE reason NOT IN ('BadDeviceToken', 'Expired', 'QUOTA_EXCEEDED') LIMIT 3)"
            ).decode(String.self).collect()
            // No healthy job dead-lettered, the outage's onset included. Each worker judges the provider alone: a
            // job retried every 50-200 ms can meet its three 503s at three workers within half a second, none of
            // which has yet seen enough. Its 5xx is its own only if a request written after its previous one (by
            // any worker: `last_attempt_at`) was answered; before that rule 0 in 30 of 33 seed runs, 1-2 in the
            // others; before the write-time and thaw rules 0-1 a seed; before the outage rules 13-140.
            let onsetLosses = try await f.db.int64(
                "SELECT count(*) FROM push.dead_jobs WHERE reason IN ('ServiceUnavailable', 'InternalServerError', 'UNAVAILABLE', 'INTERNAL')"
            )
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.dead_jobs WHERE reason NOT IN ('BadDeviceToken', 'ServiceUnavailable', 'InternalServerError', 'UNAVAILABLE', 'INTERNAL') AND device_token <> '\(unescaped: Self.hotToken)'"
                ) == 0 && onsetLosses == 0,
                "seed \(seed): no healthy job dead-lettered (a provider outage burns nothing): \(deadReasons)"
            )
            // The hot device's job ends alone (its own retries, then its expiry), with FCM's quota trap.
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.dead_jobs WHERE device_token = '\(unescaped: Self.hotToken)' AND reason IN ('QUOTA_EXCEEDED', 'Expired')"
                ) == 1,
                "seed \(seed): the hot device's job is dead with its own reason"
            )
            var outageSummary = "outage window missing"
            if let (from, to) = outageWindow {
                // Fewer than 50 requests a second reach a provider that is down, once every worker has seen it: over
                // the outage's second half, and not before 2 s after the frozen worker is let go (it writes what
                // it claimed before any answer tells it). The whole outage's requests are printed second by second.
                let frozen = (plan.freezeAt + plan.freezeFor).components
                let thaw = startedAt.addingTimeInterval(Double(frozen.seconds) + Double(frozen.attoseconds) / 1e18)
                let watched = max(
                    from.addingTimeInterval(max(2, to.timeIntervalSince(from) / 2)),
                    thaw.addingTimeInterval(2)
                )
                let span = to.timeIntervalSince(watched)
                let during = f.simulator.requests.filter { $0.receivedAt > watched && $0.receivedAt < to }.count
                if span > 1 {
                    #expect(
                        Double(during) / span < 50,
                        "seed \(seed): \(during) requests in the last \(span) s of an outage"
                    )
                }
                // Second by second from the outage's start, APNs' requests and FCM's apart (`s3: 12+4`).
                var perSecond: [Int: (apns: Int, fcm: Int)] = [:]
                for request in f.simulator.requests where request.receivedAt > from && request.receivedAt < to {
                    let second = Int(request.receivedAt.timeIntervalSince(from))
                    if request.path.hasSuffix("/messages:send") {
                        perSecond[second, default: (0, 0)].fcm += 1
                    } else {
                        perSecond[second, default: (0, 0)].apns += 1
                    }
                }
                let seconds = perSecond.sorted { $0.key < $1.key }.map {
                    "s\($0.key): \($0.value.apns)+\($0.value.fcm)"
                }
                outageSummary =
                    "outage \(Self.clockTime(from))-\(Self.clockTime(to)): \(during) requests in the last \(String(format: "%.1f", max(span, 0))) s of the outage, from \(String(format: "%.1f", watched.timeIntervalSince(from))) s (APNs+FCM each second from its start: \(seconds.joined(separator: " ")); the frozen worker let go at \(String(format: "%.1f", thaw.timeIntervalSince(from))) s)"
            }
            if let hotNeighbours {
                #expect(
                    hotNeighbours < .seconds(30),
                    "seed \(seed): a hot device's neighbours took \(hotNeighbours) (its credential was held)"
                )
                outageSummary += "; the hot device's 200 neighbours delivered in \(hotNeighbours)"
            }
            #expect(
                try await f.db.int64(
                    """
                    SELECT count(*) FROM push.jobs
                     WHERE state = 'delivered' AND coalesce_key LIKE 'revive-%' AND history @> '[{"outcome": "revived"}]'
                    """
                ) == 10,
                "seed \(seed): the revived jobs were delivered"
            )
            let requests = f.simulator.requests
            for pair in lateKeys {
                #expect(
                    try await f.db.int64(
                        "SELECT count(*) FROM push.jobs WHERE id = \(pair.older) AND state = 'superseded'"
                    ) == 1,
                    "seed \(seed): a late-committed older keyed job was not superseded"
                )
            }
            // The limit held where the requests leave: the workers' send times (each job's last_attempt_at, when
            // its request left the worker), over any window of W seconds at most rate × (W + 0.2 s) + burst (a
            // request may leave up to 0.15 s after its slot). At the simulator, which runs in this test's
            // process and on 2 loaded cores reads its sockets in bursts (a stall of a few hundred ms, then
            // every request that arrived meanwhile at one instant), the 5 s window is held to rate × (W + 1 s)
            // + burst, and the 1 s window is printed.
            var limitSummary = "limit window missing"
            if let (from, to) = limitWindow {
                let times = requests.filter {
                    $0.headers["apns-topic"] == Self.limitedTopic && $0.receivedAt > from && $0.receivedAt < to
                }.map(\.receivedAt).sorted()
                let left = try await f.db.client.query(
                    PostgresQuery(
                        unsafeSQL: """
                            SELECT extract(epoch FROM last_attempt_at)::float8 FROM push.jobs
                             WHERE topic = '\(Self.limitedTopic)'
                               AND last_attempt_at > to_timestamp(\(from.timeIntervalSince1970))
                               AND last_attempt_at < to_timestamp(\(to.timeIntervalSince1970))
                             ORDER BY 1
                            """
                    )
                ).decode(Double.self).collect()
                func worst(_ times: [Double], _ window: Double) -> Int {
                    var worst = 0
                    var start = 0
                    for (index, time) in times.enumerated() {
                        while time - times[start] >= window { start += 1 }
                        worst = max(worst, index - start + 1)
                    }
                    return worst
                }
                var parts: [String] = []
                for window in [1.0, 5.0] {
                    let sent = worst(left, window)
                    let bound = Int((Double(plan.perSecond) * (window + 0.2)).rounded(.up)) + plan.burst
                    #expect(
                        sent <= bound,
                        "seed \(seed): \(sent) limited requests left the workers in \(window) s, bound \(bound)"
                    )
                    let arrived = worst(times.map(\.timeIntervalSince1970), window)
                    if window == 5.0 {
                        let loose = Int((Double(plan.perSecond) * (window + 1)).rounded(.up)) + plan.burst
                        #expect(
                            arrived <= loose,
                            "seed \(seed): \(arrived) limited requests reached the simulator in 5 s, bound \(loose)"
                        )
                    }
                    parts.append(
                        "at most \(sent) left the workers in any \(Int(window)) s (bound \(bound)), \(arrived) reached the simulator"
                    )
                }
                // And it sends: a limited topic is not starved by a large unlimited backlog. At least 10 % of
                // the rate over the window less its first second: a frozen worker holds the slots it claimed,
                // and on 2 saturated cores a request that misses its slot by 150 ms is withdrawn (the 100k-job
                // seeds measured 28-51 %; on a machine 2.3 times slower, in the full suite, 14-16 %; before the
                // fix, 0-2 requests).
                let span = to.timeIntervalSince(from)
                let floor = Int(0.1 * Double(plan.perSecond) * max(span - 1, 0))
                #expect(
                    times.count >= floor,
                    "seed \(seed): \(times.count) limited requests in the \(span) s window, at least \(floor) expected"
                )
                parts.append("\(times.count) in its \(String(format: "%.1f", span)) s window (floor \(floor))")
                limitSummary =
                    "limited topic at \(plan.perSecond)/s burst \(plan.burst): " + parts.joined(separator: ", ")
            }
            if let (from, to) = pauseWindow {
                // Sends as the workers recorded them (each delivered job's last_attempt_at is when its request
                // left the worker): none of the paused topic after 2.5 s into the pause (jobs claimed before it
                // are in flight and finish; a loaded debug build takes a while). The simulator's arrival times
                // are no measure here: when a worker is killed, it reads the requests left in the dead
                // connection's socket at once, though they were written before the pause.
                let late = try await f.db.int64(
                    PostgresQuery(
                        unsafeSQL: """
                            SELECT count(*) FROM push.jobs
                             WHERE topic = '\(Self.pausedTopic)'
                               AND last_attempt_at > to_timestamp(\(from.timeIntervalSince1970 + 2.5))
                               AND last_attempt_at < to_timestamp(\(to.timeIntervalSince1970))
                            """
                    )
                )
                #expect(late == 0, "seed \(seed): \(late) jobs of a paused topic sent while it was paused")
            }
            for (name, worker) in [("a", a), ("b", b), ("c", c)] {
                let changes = worker.output.split(separator: "\n").filter {
                    $0.contains("is down:") || $0.contains("answers again after")
                }
                // The time and the sentence, without the logger's labels: "18:50:31 APNs production is down: …".
                let lines = changes.map { line -> String in
                    let time = line.split(separator: "T").dropFirst().first.map { String($0.prefix(8)) } ?? ""
                    let message = line.components(separatedBy: "[PushWorker] ").last ?? String(line)
                    return "\(time) \(message.prefix(90))"
                }
                print("seed \(seed): worker \(name): \(lines)")
            }
            print(
                "seed \(seed): drained in \(elapsed); \(summary); \(limitSummary); \(outageSummary); \(onsetLosses) dead at the outage's onset"
            )
        }
    }

    /// A wall instant as `HH:mm:ss.SSS` (UTC), to set beside the workers' log lines.
    static func clockTime(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.dateFormat = "HH:mm:ss.SSS"
        formatter.timeZone = TimeZone(identifier: "UTC")
        return formatter.string(from: date)
    }
}
