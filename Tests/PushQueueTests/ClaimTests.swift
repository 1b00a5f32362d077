import Foundation
import PostgresNIO
import PushCore
import PushQueue
import PushQueueTesting
import Testing

@Suite("Claiming jobs")
struct ClaimTests {
    @Test("8 concurrent claimers over 10,000 jobs never get the same job")
    func noDoubleClaims() async throws {
        try await TestPostgres.withDatabase(maxConnections: 12) { db in
            _ = try await db.int64s(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{}}' FROM generate_series(1, 10000) g
                RETURNING id
                """
            )
            let queue = db.queue
            let claimed = try await withThrowingTaskGroup(of: [Int64].self) { group in
                for claimer in 0..<8 {
                    group.addTask {
                        let worker = "claimer-\(claimer)"
                        var mine: [Int64] = []
                        while true {
                            let jobs = try await queue.claim(limit: 97, workerID: worker, lease: .seconds(60))
                            if jobs.isEmpty { return mine }
                            mine += jobs.map(\.id)
                            let outcomes = jobs.map {
                                JobOutcome(
                                    jobID: $0.id,
                                    attempt: $0.attempts,
                                    disposition: .delivered,
                                    attemptedAt: .now,
                                    status: 200
                                )
                            }
                            let result = try await queue.writeOutcomes(outcomes, workerID: worker)
                            #expect(result.fenced.isEmpty)
                        }
                    }
                }
                var all: [[Int64]] = []
                for try await ids in group { all.append(ids) }
                return all
            }
            let flat = claimed.flatMap { $0 }
            #expect(flat.count == 10_000)
            #expect(Set(flat).count == 10_000)
            #expect(claimed.filter { !$0.isEmpty }.count > 1, "the work should spread over several claimers")
            #expect(
                try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered' AND attempts = 1")
                    == 10_000
            )
        }
    }

    @Test("claims highest send priority first, then oldest run_at, and never a job not yet due")
    func ordering() async throws {
        try await TestPostgres.withDatabase { db in
            let p5old = try await enqueue(db, priority: 5, runAt: "now() - interval '10 minutes'")[0]
            let p10new = try await enqueue(db, priority: 10, runAt: "now() - interval '1 minute'")[0]
            let p10old = try await enqueue(db, priority: 10, runAt: "now() - interval '5 minutes'")[0]
            let backgroundDefault = try await enqueue(
                db,
                pushType: "background",
                runAt: "now() - interval '20 minutes'"
            )[0]
            let alertDefault = try await enqueue(db, runAt: "now() - interval '2 minutes'")[0]
            _ = try await enqueue(db, priority: 10, runAt: "now() + interval '1 hour'")
            let jobs = try await db.queue.claim(limit: 10, workerID: workerName(), lease: .seconds(30))
            #expect(jobs.map(\.id) == [p10old, alertDefault, p10new, backgroundDefault, p5old])
            #expect(jobs.allSatisfy { $0.attempts == 1 })
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'pending'") == 1)
        }
    }

    @Test("a claim sets running, the lease and the worker; excluded credentials stay pending")
    func claimFields() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, credential) VALUES
                ('com.example.app', repeat('aa', 64 / length('aa')), '{"aps":{}}', 'paused'), ('com.example.app', repeat('bb', 64 / length('bb')), '{"aps":{}}', 'default')
                """
            )
            let worker = workerName()
            let jobs = try await db.queue.claim(
                limit: 10,
                workerID: worker,
                lease: .seconds(30),
                excludingCredentials: ["paused"]
            )
            #expect(jobs.map(\.credential) == ["default"])
            let rows = try await db.client.query(
                "SELECT state, locked_by, extract(epoch FROM locked_until - now())::float8 FROM push.jobs WHERE id = \(jobs[0].id)"
            ).decode((String, String, Double).self)
            for try await (state, lockedBy, leaseLeft) in rows {
                #expect(state == "running")
                #expect(lockedBy == worker)
                #expect(leaseLeft > 20 && leaseLeft <= 30)
            }
        }
    }

    @Test(
        "a prepared claim whose preparation the server refused (a lock timeout during a migration) does not fail every later claim on its connection: the queue goes on unprepared"
    )
    func refusedPreparation() async throws {
        try await TestPostgres.withDatabase { db in
            let ids = try await enqueue(db, count: 3)
            // The worker's sessions, one connection (every claim lands on it), and a role-style lock_timeout.
            var configuration = db.url.clientConfiguration
            configuration.options.maximumConnections = 1
            configuration.options.additionalStartupParameters =
                JobQueue.workerSessionSettings + [("lock_timeout", "200ms")]
            let client = PostgresClient(configuration: configuration, backgroundLogger: db.logger)
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { await client.run() }
                defer { group.cancelAll() }
                let queue = JobQueue(
                    client: client,
                    logger: db.logger,
                    clock: ContinuousClock(),
                    preparedStatements: true
                )
                // A migration holds push.jobs: the claim's first Parse waits for the lock and times out.
                try await db.client.withConnection { migration in
                    try await migration.query("BEGIN", logger: db.logger)
                    try await migration.query("LOCK TABLE push.jobs IN ACCESS EXCLUSIVE MODE", logger: db.logger)
                    await #expect(throws: PSQLError.self) {
                        _ = try await queue.claim(limit: 1, workerID: "w", lease: .seconds(30))
                    }
                    try await migration.query("COMMIT", logger: db.logger)
                }
                // The lock is gone. PostgresNIO keeps a failed preparation on its connection; the queue
                // must not use it again.
                let claimed = try await queue.claim(limit: 10, workerID: "w", lease: .seconds(30))
                #expect(claimed.map(\.id).sorted() == ids.sorted())
                let outcomes = claimed.map {
                    JobOutcome(
                        jobID: $0.id,
                        attempt: $0.attempts,
                        disposition: .delivered,
                        attemptedAt: .now,
                        status: 200
                    )
                }
                #expect(try await queue.writeOutcomes(outcomes, workerID: "w").recorded.count == 3)
            }
        }
    }
}
