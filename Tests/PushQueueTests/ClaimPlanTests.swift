import Foundation
import PostgresNIO
import PushQueueTesting
import Testing

@testable import PushQueue

/// The claim's work is bounded by its batch, whatever the table looked like when its statistics were taken
/// and however many topics hold the due jobs; and a claim the worker stops waiting for stops on the server.
/// Work is counted in buffers (EXPLAIN's shared blocks), which a loaded machine does not change.
@Suite("Claim plans: bounded by the batch, whatever the statistics say")
struct ClaimPlanTests {
    /// The table as statistics last saw it, then what is pending when the claim runs.
    struct Shape: Sendable, CustomTestStringConvertible {
        let name: String
        /// Run before `ANALYZE` (or `VACUUM ANALYZE`).
        let before: String
        /// Run after it: the jobs the claim meets.
        let after: String
        var testDescription: String { self.name }
    }

    static func insert(_ count: Int, topics: Int, keyed: String = "NULL", prefix: String = "t") -> String {
        """
        INSERT INTO push.jobs (topic, device_token, payload, coalesce_key)
        SELECT 'com.example.\(prefix)' || (g % \(topics)), lpad(to_hex(g), 64, 'a'), '{"aps":{"alert":"hi"}}', \(keyed)
          FROM generate_series(1, \(count)) AS g
        """
    }

    static let drained = [
        insert(5_000, topics: 1), "UPDATE push.jobs SET state = 'delivered', delivered_at = now()",
    ]

    static let shapes: [Shape] = [
        // The incident: a drain, autovacuum's own VACUUM ANALYZE, a burst of one topic (the old supersede step
        // read every pending row once per pending row: 40 s).
        Shape(
            name: "drained, then one topic",
            before: drained.joined(separator: ";\n"),
            after: insert(20_000, topics: 1)
        ),
        Shape(
            name: "drained, then 2,000 topics, two jobs per latest-wins key",
            before: drained.joined(separator: ";\n"),
            after: insert(5_000, topics: 2_000, keyed: "'k' || (g % 2500)")
        ),
        Shape(name: "empty, then 2,000 topics", before: "SELECT 1", after: insert(5_000, topics: 2_000)),
        Shape(
            name: "one topic, then 10,000 topics, every job keyed",
            before: insert(5_000, topics: 1) + ";\nDELETE FROM push.jobs",
            after: insert(10_000, topics: 10_000, keyed: "'k' || g")
        ),
        Shape(
            name: "the real shape: 2,000 topics beside 30,000 paused jobs",
            before: """
                \(insert(30_000, topics: 50, prefix: "paused"));
                INSERT INTO push.pauses (topic, reason) SELECT 'com.example.paused' || g, 'test' FROM generate_series(0, 49) AS g;
                \(insert(5_000, topics: 2_000))
                """,
            after: "SELECT 1"
        ),
    ]

    @Test(
        "one claim of 100 reads a bounded number of buffers after ANALYZE of a table that looked different",
        arguments: shapes
    )
    func boundedWhateverTheStatistics(shape: Shape) async throws {
        try await TestPostgres.withDatabase { db in
            for statement in shape.before.components(separatedBy: ";\n") { try await db.execute(statement) }
            try await db.execute("VACUUM ANALYZE push.jobs")
            for statement in shape.after.components(separatedBy: ";\n") { try await db.execute(statement) }
            let plan = try await Self.explainClaim(db, batch: 100)
            let claimed = try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'running'")
            #expect(claimed == 100, "\(shape.name): the claim took \(claimed)")
            // One claim of 100 from one topic reads about 1,500 buffers; the old statement read 31,920,000 in
            // one node after a drain of 20,000 (quadratic in the pending rows: about 2,000,000 here).
            #expect(plan.total < 12_000 && plan.largestNode < 6_000, "\(shape.name): \(plan)")
        }
    }

    @Test(
        "the rate formula (push.rate_available, migration 0016) gives the old inline expression's answer and is inlined into the claim's plan"
    )
    func rateFormulaInlined() async throws {
        try await TestPostgres.withDatabase { db in
            // The expression the claim carried inline before schema 16, over rates whose float8 interval
            // rounds under one (82 of the integer rates 1-1000 do), bursts, delays and half leases.
            let differing = try await db.int64(
                """
                SELECT count(*) FROM generate_series(1, 1000) AS r, (VALUES (1), (7), (100)) AS b(burst),
                       (VALUES (0.0), (0.25), (3.0)) AS d(delay), (VALUES (0.5), (4.0), (30.0)) AS h(half)
                 WHERE push.rate_available(r::float8, b.burst::float8, d.delay::float8, h.half::float8)
                       IS DISTINCT FROM floor((least(b.burst::float8 / r::float8, greatest(h.half::float8, 1 / r::float8))
                                               - d.delay::float8) * r::float8 + 1e-9)
                """
            )
            #expect(differing == 0)
            try await db.execute("INSERT INTO push.rate_limits (topic, per_second, burst) VALUES ('t', 50, 5)")
            var plan = ""
            for try await line in try await db.client.query(
                """
                EXPLAIN (VERBOSE, COSTS OFF) SELECT push.rate_available(per_second::float8, burst::float8, 0, 30)
                  FROM push.rate_limits
                """
            ).decode(String.self) {
                plan += line + "\n"
            }
            #expect(plan.contains("floor(") && !plan.contains("rate_available"), "not inlined: \(plan)")
        }
    }

    @Test("a queue's claims serve every topic once before any topic twice")
    func rotatesAcrossTopics() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute(Self.insert(600, topics: 300))
            let queue = db.queue
            for round in 0..<2 {
                var topics: [String] = []
                for _ in 0..<10 {
                    let batch = try await queue.claimBatch(limit: 30, workerID: "w", lease: .seconds(60))
                    topics += batch.jobs.map(\.topic)
                }
                #expect(topics.count == 300 && Set(topics).count == 300, "round \(round): \(Set(topics).count) topics")
            }
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'pending'") == 0)
        }
    }

    @Test("a walk past paused topics says there may be more, and the next claims reach the topic behind them")
    func walksPastPausedTopics() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute(Self.insert(300, topics: 150, prefix: "a"))
            try await db.execute(
                "INSERT INTO push.pauses (topic, reason) SELECT 'com.example.a' || g, 'test' FROM generate_series(0, 149) AS g"
            )
            try await db.execute(Self.insert(5, topics: 1, prefix: "z"))
            let queue = db.queue
            var claims = 0
            var claimed: [String] = []
            while claimed.isEmpty && claims < 20 {
                let batch = try await queue.claimBatch(limit: 20, workerID: "w", lease: .seconds(60))
                claims += 1
                claimed = batch.jobs.map(\.topic)
                if claimed.isEmpty { #expect(batch.walkIncomplete, "claim \(claims) walked paused topics only") }
            }
            #expect(claimed == Array(repeating: "com.example.z0", count: 5))
            #expect(claims <= 9, "150 paused topics at 20 a claim")
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE state = 'running' AND topic LIKE 'com.example.a%'"
                ) == 0
            )
        }
    }

    @Test("credentials with only retries waiting do not shrink a busy credential's walk")
    func waitingCredentialsDoNotDilute() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, credential, run_at)
                SELECT 'com.example.app', lpad(to_hex(g), 64, 'a'), '{"aps":{}}', 'waiting' || g, now() + interval '1 hour'
                  FROM generate_series(1, 99) AS g
                """
            )
            try await db.execute(Self.insert(300, topics: 300))
            let batch = try await db.queue.claimBatch(limit: 100, workerID: "w", lease: .seconds(60))
            // 99 waiting credentials and one busy: the busy one's walk is not cut to one topic a claim. (At
            // most 32 batches of topics are walked over all pairs with pending jobs: 32 here.)
            #expect(batch.jobs.count >= 32, "took \(batch.jobs.count)")
        }
    }

    @Test("a claimed key's older backlog is retired a bounded number at a time, all of it in the end")
    func boundedSupersede() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute(Self.insert(1_500, topics: 1, keyed: "'hot'"))
            let queue = db.queue
            let first = try await queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(first.jobs.count == 1 && first.superseded == 1_000, "superseded \(first.superseded)")
            var claims = 1
            while try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'pending'") > 0 && claims < 200 {
                let batch = try await queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
                #expect(batch.jobs.isEmpty, "an older job of a claimed key was claimed")
                claims += 1
            }
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'superseded'") == 1_499)
        }
    }

    @Test(
        "a claim abandoned at its deadline is gone from pg_stat_activity within a second (statement_timeout from the deadline)"
    )
    func abandonedClaimIsCancelled() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await enqueue(db, count: 3)
            let stopped = try await Self.abandonClaim(
                db,
                settings: JobQueue.workerSessionSettings(statementTimeout: .seconds(3))
            )
            #expect(!stopped, "with statement_timeout the abandoned claim is gone within a second")
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'pending'") == 3)
            // The control: without the timeout, the abandoned claim goes on waiting on the server, and claims the
            // jobs once the lock is gone, for a worker that no longer waits for them (they return at its lease).
            let kept = try await Self.abandonClaim(db, settings: JobQueue.workerSessionSettings)
            #expect(kept, "without statement_timeout the abandoned claim still runs")
        }
    }

    /// Holds `push.pauses` in another session, claims with a 3 s deadline on a client with `settings`, and
    /// says whether the claim is still active on the server a second after the worker gave up on it.
    static func abandonClaim(_ db: TestDatabase, settings: [(String, String)]) async throws -> Bool {
        let application = "abandon-\(UInt32.random(in: 0...UInt32.max))"
        var configuration = db.url.clientConfiguration
        configuration.options.maximumConnections = 1
        // The lock wait outlasts the check (the worker's 5 s lock_timeout would end the control's claim too).
        configuration.options.additionalStartupParameters =
            settings.filter { $0.0 != "lock_timeout" } + [("lock_timeout", "60s"), ("application_name", application)]
        let client = PostgresClient(configuration: configuration, backgroundLogger: db.logger)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            let queue = JobQueue(client: client, logger: db.logger, clock: ContinuousClock(), preparedStatements: true)
            // Connected before the clock starts: the worker's deadline and the server's statement_timeout then
            // start together (on a loaded machine a new connection's handshake took over a second of the
            // deadline, and the server's clock, started later, outlived the check).
            _ = try await client.query("SELECT 1", logger: db.logger).collect()
            return try await db.client.withConnection { holder in
                try await holder.query("BEGIN", logger: db.logger)
                try await holder.query("LOCK TABLE push.pauses IN ACCESS EXCLUSIVE MODE", logger: db.logger)
                let claim = Task {
                    _ = try await withDeadline(.seconds(3), "the claim") {
                        try await queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
                    }
                }
                // Held at the lock: the claim waits on it, active (polled: a loaded machine may take a moment
                // to connect and prepare).
                var waiting: Int64 = 0
                for _ in 0..<25 where waiting == 0 {
                    try await Task.sleep(for: .milliseconds(100))
                    waiting = try await db.int64(
                        PostgresQuery(
                            unsafeSQL:
                                "SELECT count(*) FROM pg_stat_activity WHERE application_name = '\(application)' AND state = 'active' AND wait_event_type = 'Lock'"
                        )
                    )
                }
                #expect(waiting == 1, "the claim waits on the held lock")
                await #expect(throws: (any Error).self) { try await claim.value }
                // The worker gave up at its deadline: within a second, is the statement still running?
                try await Task.sleep(for: .seconds(1))
                let active = try await db.int64(
                    PostgresQuery(
                        unsafeSQL:
                            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '\(application)' AND state = 'active'"
                    )
                )
                try await holder.query("COMMIT", logger: db.logger)
                return active > 0
            }
        }
    }

    @Test(
        "a busy range resumes after its last claimed job: with 20,000 claimed jobs' entries still in the index (no vacuum yet), a resumed claim of 100 reads a small fraction of what a claim from the range's head does"
    )
    func resumedRangeStepsOverNothing() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute("ALTER TABLE push.jobs SET (autovacuum_enabled = off)")
            try await db.execute(Self.insert(30_000, topics: 1))
            try await db.execute("ANALYZE push.jobs")
            // 20,000 claimed (as claims leave them: running, their pending entries dead until a vacuum).
            try await db.execute(
                "UPDATE push.jobs SET state = 'running', locked_by = 'x', locked_until = now() + interval '1 hour' WHERE id IN (SELECT id FROM push.jobs ORDER BY id LIMIT 20000)"
            )
            let last = try await db.client.query(
                "SELECT (extract(epoch FROM run_at) * 1000000)::bigint, id FROM push.jobs WHERE state = 'running' ORDER BY run_at DESC, id DESC LIMIT 1"
            ).decode((Int64, Int64).self).collect()
            let point = try #require(last.first)
            let head = try await Self.explainClaim(db, batch: 100)
            let resumed = try await Self.explainClaim(
                db,
                batch: 100,
                resume: ("com.example.t0", point.0, point.1 + 100)
            )
            print(
                "20,000 dead entries before the range's due jobs: a claim of 100 from the head read \(head); resumed, \(resumed)"
            )
            // From the head, each probe of the range and its scan step over the 20,000 entries (about 200 buffers
            // each); resumed, none does.
            #expect(
                head.claimIndex > 800 && resumed.claimIndex * 10 < head.claimIndex,
                "head \(head), resumed \(resumed)"
            )
            // Both claimed 100 jobs each, in order: the head claim the next 100, the resumed one the 100 after.
            let claimed = try await db.int64s("SELECT id FROM push.jobs WHERE locked_by = 'w' ORDER BY id")
            #expect(claimed.count == 200 && claimed == Array(claimed[0]..<claimed[0] + 200))
        }
    }

    @Test(
        "a job enqueued behind a busy range's resume point (its run_at already past) is claimed once the range is read from its head again, when the point's life (1 s) is over"
    )
    func behindTheResumePoint() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute(Self.insert(3_000, topics: 1))
            // One queue, as a worker's claim loop has (its cursor and resume points live in it). Points live a
            // minute here, not 1 s, until the test ends their life: in the suite's first minute this machine took
            // more than 4 s between two claims.
            let queue = db.queue
            queue.claimCursor.value.headInterval = .seconds(60)
            let first = try await queue.claimBatch(limit: 100, workerID: "w", lease: .seconds(60))
            #expect(first.jobs.count == 100 && queue.claimCursor.value.resumes.count == 1)
            let late = try await db.int64s(
                "INSERT INTO push.jobs (topic, device_token, payload, run_at) VALUES ('com.example.t0', lpad('f', 64, 'f'), '{\"aps\":{}}', now() - interval '1 hour') RETURNING id"
            )
            // Resumed after the first claim's last job: the late job, at the range's head, is passed.
            let resumed = try await queue.claimBatch(limit: 100, workerID: "w", lease: .seconds(60))
            #expect(resumed.jobs.count == 100 && !resumed.jobs.contains { $0.id == late[0] })
            #expect(resumed.jobs.map(\.id).min()! > first.jobs.map(\.id).max()!, "in order after the first claim")
            // The point's life over (a life is checked when a claim reads the cursor).
            queue.claimCursor.value.headInterval = .milliseconds(1)
            try await Task.sleep(for: .milliseconds(5))
            let head = try await queue.claimBatch(limit: 100, workerID: "w", lease: .seconds(60))
            #expect(head.jobs.first?.id == late[0], "the oldest due job first, once read from the head")
        }
    }

    @Test("resume points: a point lives a second from its range's last read from the head; at most 64 are kept")
    func resumePointsExpire() {
        typealias Cursor = JobQueue.ClaimCursor
        let t0 = ContinuousClock.now
        let key = Cursor.RangeKey(credential: "c", environment: "production", topic: "t", priority: 10)
        var cursor = Cursor()
        // Read from the head at t0: a point from then.
        cursor.resumes = cursor.updated(sent: [:], reported: [(key, 1, 10)], at: t0)
        #expect(cursor.resumes[key]?.headReadAt == t0)
        // Resumed at t0 + 0.5 s: the new point keeps t0.
        let sent = cursor.livePoints(at: t0 + .milliseconds(500))
        #expect(sent[key]?.id == 10)
        cursor.resumes = cursor.updated(sent: sent, reported: [(key, 2, 20)], at: t0 + .milliseconds(500))
        #expect(cursor.resumes[key]?.id == 20 && cursor.resumes[key]?.headReadAt == t0)
        // A second after t0 it is not sent: the range is read from its head.
        #expect(cursor.livePoints(at: t0 + .milliseconds(1_001)).isEmpty)
        // A range that gave less than its share goes back to its head.
        cursor.resumes = cursor.updated(sent: sent, reported: [(key, 0, 0)], at: t0 + .milliseconds(600))
        #expect(cursor.resumes.isEmpty)
        // 70 points: the 64 whose ranges were read from their heads last stay.
        let many = (0..<70).map {
            (
                Cursor.RangeKey(credential: "c", environment: "production", topic: "t\($0)", priority: 10), Int64(1),
                Int64($0 + 1)
            )
        }
        var points: [Cursor.RangeKey: Cursor.ResumePoint] = [:]
        for (n, point) in many.enumerated() {
            points[point.0] = .init(runAtMicros: 1, id: point.2, headReadAt: t0 + .milliseconds(n))
        }
        let kept = cursor.updated(sent: points, reported: [], at: t0 + .milliseconds(100))
        #expect(kept.count == 64 && kept[many[0].0] == nil && kept[many[69].0] != nil)
    }

    /// Buffers one claim read: in all (the plan's top node holds its children's) and in its busiest node.
    struct Buffers: CustomStringConvertible {
        var total = 0
        var largestNode = 0
        var largestNodeName = ""
        /// Read by the scans and probes of the claim's index (`jobs_claim_by_topic_idx`), with their heap.
        var claimIndex = 0
        var description: String {
            "\(total) buffers in all, \(largestNode) in \(largestNodeName), \(claimIndex) by the claim index's scans"
        }
    }

    /// The claim as the worker runs it (a generic plan, prepared, seqscan off), once, under EXPLAIN ANALYZE.
    /// - Parameter resume: one resume point, (topic, run_at in microseconds, id) of credential `default`,
    ///   environment production, priority 10.
    static func explainClaim(
        _ db: TestDatabase,
        batch: Int,
        resume: (topic: String, runAtMicros: Int64, id: Int64)? = nil
    ) async throws -> Buffers {
        // With a resume point, the claim as a worker's steady state sends it: its credential named, its walk's
        // cursor at that topic.
        let credentials = resume == nil ? "'{}', true" : "'{default}', false"
        let cursor = resume.map { "'{default}', '{production}', '{\($0.topic)}'" } ?? "'{}', '{}', '{}'"
        let resumes =
            resume.map {
                "'{default}', '{production}', '{\($0.topic)}', '{10}', '{\($0.runAtMicros)}', '{\($0.id)}'"
            } ?? "'{}', '{}', '{}', '{}', '{}', '{}'"
        let types = [
            "text[]", "boolean", "text[]", "float8", "text[]", "text[]", "bigint[]", "boolean", "bigint", "text",
            "float8", "text[]", "text[]", "text[]", "text[]", "text[]", "text[]", "text[]", "smallint[]", "bigint[]",
            "bigint[]",
        ]
        #expect(types.count == ClaimStatement.statement.binds.count)
        return try await db.client.withConnection { connection in
            for setting in JobQueue.workerSessionSettings {
                try await connection.query(
                    PostgresQuery(unsafeSQL: "SET \(setting.0) = '\(setting.1)'"),
                    logger: db.logger
                )
            }
            try await connection.query(
                PostgresQuery(unsafeSQL: "PREPARE t_claim(\(types.joined(separator: ", "))) AS \(ClaimStatement.sql)"),
                logger: db.logger
            )
            let rows = try await connection.query(
                PostgresQuery(
                    unsafeSQL: """
                        EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
                        EXECUTE t_claim(\(credentials), '{}', 30, '{}', '{}', '{}', true, \(batch), 'w', 60, '{}', \(cursor), \(resumes))
                        """
                ),
                logger: db.logger
            )
            var text = ""
            for try await line in rows.decode(String.self) { text += line }
            try await connection.query("DEALLOCATE t_claim", logger: db.logger)
            let json = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [[String: Any]]
            guard let plan = json?.first?["Plan"] as? [String: Any] else { return Buffers() }
            var buffers = Buffers()
            func hits(_ node: [String: Any]) -> Int {
                (node["Shared Hit Blocks"] as? Int ?? 0) + (node["Shared Read Blocks"] as? Int ?? 0)
            }
            buffers.total = hits(plan)
            func walk(_ node: [String: Any]) {
                let children = node["Plans"] as? [[String: Any]] ?? []
                // A node's own reads: its count less its children's.
                let own = hits(node) - children.map(hits).reduce(0, +)
                if node["Index Name"] as? String == "jobs_claim_by_topic_idx" {
                    buffers.claimIndex += own
                }
                if own > buffers.largestNode {
                    buffers.largestNode = own
                    buffers.largestNodeName =
                        "\(node["Node Type"] ?? "?") \(node["Index Name"] ?? "") \(node["Subplan Name"] ?? "")"
                }
                children.forEach(walk)
            }
            walk(plan)
            return buffers
        }
    }
}
