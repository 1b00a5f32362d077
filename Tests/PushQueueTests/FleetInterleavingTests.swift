import Foundation
import Logging
import PostgresNIO
import PushCore
import PushQueueTesting
import Synchronization
import Testing

@testable import PushQueue

/// Each interleaving a fleet meets, at the SQL level: one session is held at its lock (a producer's open
/// transaction, an operator's row lock, another claimer's schedule), and `pg_stat_activity` says whether
/// the worker's statement waits on it. A worker statement that waits behind a neighbour stops the fleet.
@Suite("Fleet interleavings in SQL")
struct FleetInterleavingTests {
    /// Runs `statement` while another session holds a lock. Returns its result and whether it was seen
    /// waiting on a lock in `pg_stat_activity`; a statement that waits is let go by `release` (so the test
    /// ends) and reported as waiting.
    static func watch<T: Sendable>(
        _ db: TestDatabase,
        release: @escaping @Sendable () async throws -> Void,
        _ statement: @escaping @Sendable () async throws -> T
    ) async throws -> (value: T, waited: Bool) {
        let done = Mutex(false)
        let task = Task {
            defer { done.withLock { $0 = true } }
            return try await statement()
        }
        var waited = false
        // Waiting is a lock wait seen in pg_stat_activity, not slowness: on two loaded cores a statement that
        // waits for nothing has taken more than 3 s (the full suite's first minute, 2026-11-29). A statement
        // neither done nor seen waiting after a minute counts as waiting.
        let deadline = ContinuousClock.now + .seconds(60)
        while !done.withLock({ $0 }) && ContinuousClock.now < deadline {
            let waiting = try await db.int64(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if waiting > 0 {
                waited = true
                break
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        if !done.withLock({ $0 }) {
            waited = true
            try await release()
        }
        return (try await task.value, waited)
    }

    /// A session of its own, held open by the test (BEGIN … COMMIT).
    static func session(_ db: TestDatabase, applicationName: String? = nil) async throws -> PostgresConnection {
        var configuration = try db.url.connectionConfiguration()
        if let applicationName {
            configuration.options.additionalStartupParameters = [("application_name", applicationName)]
        }
        return try await PostgresConnection.connect(configuration: configuration, id: 1, logger: db.logger)
    }

    static let token = String(repeating: "ab", count: 32)

    @Test(
        "a producer holding an open re-enqueue of every in-flight apns_id stops no worker statement: outcomes, dead-letter moves, leases, heartbeat and reaper run past it"
    )
    func openProducerTransaction() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await enqueue(db, count: 20)
            let jobs = try await db.queue.claim(limit: 20, workerID: "w", lease: .seconds(30))
            #expect(jobs.count == 20)
            let producer = try await Self.session(db)
            defer { Task { try? await producer.close() } }
            try await producer.query("BEGIN", logger: db.logger)
            // The outbox's idempotent re-enqueue of every job (the guide's producer role can run it).
            try await producer.query(
                """
                INSERT INTO push.jobs (topic, device_token, payload, apns_id)
                SELECT topic, device_token, payload, apns_id FROM push.jobs ON CONFLICT (apns_id) DO NOTHING
                """,
                logger: db.logger
            )
            let release: @Sendable () async throws -> Void = {
                _ = try await producer.query("COMMIT", logger: db.logger)
            }
            let outcomes = jobs.enumerated().map { index, job in
                JobOutcome(
                    jobID: job.id,
                    attempt: job.attempts,
                    disposition: index % 2 == 0 ? .delivered : .dead(sentence: "gone"),
                    attemptedAt: .now,
                    status: index % 2 == 0 ? 200 : 410,
                    reason: index % 2 == 0 ? nil : "Unregistered"
                )
            }
            let written = try await Self.watch(db, release: release) {
                try await db.queue.writeOutcomes(Array(outcomes.prefix(10)), workerID: "w").recorded.count
            }
            #expect(written.value == 10 && !written.waited, "the outcome write with dead-letter moves waited")
            let leases = try await Self.watch(db, release: release) {
                try await db.queue.extendLeases(jobs.suffix(10).map(\.id), workerID: "w", lease: .seconds(30))
            }
            #expect(leases.value == 10 && !leases.waited)
            let beat = try await Self.watch(db, release: release) {
                try await db.queue.heartbeat(workerID: "w", host: "h", pid: 1, credentials: [])
            }
            #expect(!beat.waited)
            let reaped = try await Self.watch(db, release: release) {
                try await db.queue.reapJobsOfGoneWorkers(staleAfter: .seconds(6), workerID: "other")
            }
            #expect(reaped.value.isEmpty && !reaped.waited)
            let rest = try await Self.watch(db, release: release) {
                try await db.queue.writeOutcomes(Array(outcomes.suffix(10)), workerID: "w").recorded.count
            }
            #expect(rest.value == 10 && !rest.waited)
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'"
                ) == 1,
                "the producer's transaction was open throughout"
            )
            try await release()
            // Nothing was enqueued twice: every apns_id was in the ledger.
            #expect(try await db.int64("SELECT count(*) FROM push.jobs") == 10)
            #expect(try await db.int64("SELECT count(*) FROM push.dead_jobs") == 10)
        }
    }

    @Test("the reaper and lease extension skip a row another session holds, and take it once it is free")
    func reaperSkipsLockedRows() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await enqueue(db, count: 2)
            let jobs = try await db.queue.claim(limit: 2, workerID: "gone", lease: .seconds(30))
            try await db.execute(
                "INSERT INTO push.workers (worker_id, host, pid, credentials, heartbeat_at) VALUES ('gone', 'h', 1, '{}', now() - interval '1 minute')"
            )
            let holder = try await Self.session(db)
            defer { Task { try? await holder.close() } }
            try await holder.query("BEGIN", logger: db.logger)
            try await holder.query("SELECT id FROM push.jobs WHERE id = \(jobs[0].id) FOR UPDATE", logger: db.logger)
            let release: @Sendable () async throws -> Void = { _ = try await holder.query("COMMIT", logger: db.logger) }
            // No restart grace: the test cluster itself started moments ago.
            let reaped = try await Self.watch(db, release: release) {
                try await db.queue.reapJobsOfGoneWorkers(
                    staleAfter: .seconds(6),
                    workerID: "other",
                    restartGrace: .zero
                )
            }
            #expect(reaped.value == [jobs[1].id] && !reaped.waited)
            let extended = try await Self.watch(db, release: release) {
                try await db.queue.extendLeases([jobs[0].id], workerID: "gone", lease: .seconds(30))
            }
            #expect(extended.value == 0 && !extended.waited)
            try await release()
            #expect(
                try await db.queue.reapJobsOfGoneWorkers(
                    staleAfter: .seconds(6),
                    workerID: "other",
                    restartGrace: .zero
                )
                    == [jobs[0].id]
            )
        }
    }

    @Test(
        "a worker whose heartbeat stopped keeps its jobs while its Postgres session is open (frozen), up to the bound; once its session closes (killed) they come back at once"
    )
    func frozenIsNotGone() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await enqueue(db, count: 3)
            let worker = workerName("frozen")
            let session = try await Self.session(db, applicationName: JobQueue.applicationName(of: worker))
            let sessionPID = try await session.query("SELECT pg_backend_pid()::bigint", logger: db.logger)
                .collect().first?.decode(Int64.self)
            try await db.queue.heartbeat(workerID: worker, host: "h", pid: 1, credentials: [], sessionTracked: true)
            let jobs = try await db.queue.claim(limit: 3, workerID: worker, lease: .seconds(30))
            #expect(jobs.count == 3)
            // Frozen 30 s: heartbeat stale, session open.
            try await db.execute(
                "UPDATE push.workers SET heartbeat_at = now() - interval '30 seconds' WHERE worker_id = '\(worker)'"
            )
            try await db.execute("UPDATE push.jobs SET locked_until = now() - interval '1 second'")
            let reap = {
                try await db.queue.reapJobsOfGoneWorkers(
                    staleAfter: .seconds(6),
                    workerID: "other",
                    restartGrace: .zero,
                    frozenAfter: .seconds(120)
                )
            }
            #expect(try await reap().isEmpty, "a frozen worker's jobs were taken back while its session is open")
            // Past the operator's bound, even an open session does not hold them.
            try await db.execute(
                "UPDATE push.workers SET heartbeat_at = now() - interval '121 seconds' WHERE worker_id = '\(worker)'"
            )
            #expect(try await reap().count == 3)
            // Claimed again by the same worker; then it dies: its session closes and the jobs come back at once.
            let again = try await db.queue.claim(limit: 3, workerID: worker, lease: .seconds(30))
            #expect(again.count == 3)
            try await db.execute(
                "UPDATE push.workers SET heartbeat_at = now() - interval '7 seconds' WHERE worker_id = '\(worker)'"
            )
            #expect(try await reap().isEmpty)
            try await session.close()
            // The server drops the closed session from pg_stat_activity when its backend has exited: at once on a
            // quiet machine, seconds later on one the parallel suite loads (2 s was not always enough).
            var back: [Int64] = []
            let deadline = ContinuousClock.now + .seconds(30)
            while back.isEmpty && ContinuousClock.now < deadline {
                back = try await reap()
                if back.isEmpty { try await Task.sleep(for: .milliseconds(20)) }
            }
            if back.count != 3 {
                // What Postgres still shows of the closed session, and the worker row, for the next reader.
                let seen = try await db.client.query(
                    """
                    SELECT 'pid ' || a.pid || ' in ' || a.datname || ' ' || coalesce(a.state, '') || ' since '
                           || a.backend_start::text || ' (the closed session was pid ' || \(sessionPID ?? 0)::text || ')'
                      FROM pg_stat_activity AS a WHERE a.application_name = left(\(worker), 63)
                    UNION ALL
                    SELECT 'worker row: heartbeat ' || (now() - heartbeat_at)::text || ' ago, tracked '
                           || session_tracked::text FROM push.workers WHERE worker_id = \(worker)
                    """
                ).decode(String.self).collect()
                Issue.record("the killed worker's jobs did not come back within 30 s: \(seen)")
            }
        }
    }

    @Test(
        "claimers never queue on a rate limit: while another claimer holds the schedule, a claim takes the unlimited jobs at once and leaves the limited ones"
    )
    func limitRowHeld() async throws {
        try await TestPostgres.withDatabase { db in
            let limited = try await enqueue(db, count: 5, topic: "com.example.limited")
            let free = try await enqueue(db, count: 5)
            try await db.execute(
                "INSERT INTO push.rate_limits (topic, per_second, burst) VALUES ('com.example.limited', 100, 100)"
            )
            let holder = try await Self.session(db)
            defer { Task { try? await holder.close() } }
            try await holder.query("BEGIN", logger: db.logger)
            try await holder.query("SELECT id FROM push.rate_limits FOR UPDATE", logger: db.logger)
            let release: @Sendable () async throws -> Void = { _ = try await holder.query("COMMIT", logger: db.logger) }
            let claimed = try await Self.watch(db, release: release) {
                try await db.queue.claimBatch(limit: 20, workerID: "w", lease: .seconds(30))
            }
            #expect(!claimed.waited, "the claim queued on the held schedule")
            #expect(Set(claimed.value.jobs.map(\.id)) == Set(free))
            try await release()
            let next = try await db.queue.claimBatch(limit: 20, workerID: "w", lease: .seconds(30))
            #expect(Set(next.jobs.map(\.id)) == Set(limited))
        }
    }

    @Test("any rate sends: one a minute, burst 1, claims its first job now and the next a minute later")
    func slowLimit() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await enqueue(db, count: 3)
            try await db.execute("INSERT INTO push.rate_limits (per_second, burst) VALUES (0.0166667, 1)")
            let first = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(30))
            #expect(first.jobs.count == 1)
            let sendAt = try #require(first.jobs.first?.sendAt)
            #expect(abs(sendAt.timeIntervalSinceNow) < 5)
            let second = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(30))
            #expect(second.jobs.isEmpty)
            let wait = try #require(second.rateLimitedFor)
            #expect(wait > .seconds(50) && wait <= .seconds(61))
        }
    }

    @Test(
        "fair share by work: one credential alone with due work among ten configured fills the whole batch; two busy ones share it"
    )
    func fairShareByWork() async throws {
        try await TestPostgres.withDatabase { db in
            let credentials = (0..<10).map { "c\($0)" }
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, credential)
                SELECT 'com.example.app', lpad(to_hex(g), 64, 'a'), '{"aps":{}}', 'c3' FROM generate_series(1, 300) g
                """
            )
            let alone = try await db.queue.claimBatch(
                limit: 100,
                workerID: "w",
                lease: .seconds(30),
                onlyCredentials: credentials
            )
            #expect(alone.jobs.count == 100)
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, credential)
                SELECT 'com.example.app', lpad(to_hex(g), 64, 'b'), '{"aps":{}}', 'c7' FROM generate_series(1, 300) g
                """
            )
            let shared = try await db.queue.claimBatch(
                limit: 100,
                workerID: "w",
                lease: .seconds(30),
                onlyCredentials: credentials
            )
            #expect(shared.jobs.count == 100)
            #expect(shared.jobs.filter { $0.credential == "c3" }.count == 50)
            #expect(shared.mayHaveMore)
        }
    }

    static func keyed(
        _ db: TestDatabase,
        key: String,
        topic: String = "com.example.app",
        runAt: String = "now()"
    )
        async throws -> Int64
    {
        try await db.int64(
            PostgresQuery(
                unsafeSQL:
                    "INSERT INTO push.jobs (topic, device_token, payload, coalesce_key, run_at) VALUES ('\(topic)', '\(token)', '{\"aps\":{}}', '\(key)', \(runAt)) RETURNING id"
            )
        )
    }

    @Test(
        "latest wins across retries: an older job waiting for its retry is superseded when a newer one of its key is claimed, and its holder's late outcome cannot bring it back"
    )
    func latestWinsAcrossRetry() async throws {
        try await TestPostgres.withDatabase { db in
            let older = try await Self.keyed(db, key: "k")
            let first = try await db.queue.claim(limit: 1, workerID: "w1", lease: .seconds(30))
            // A 500: back to pending, due in 10 s.
            _ = try await db.queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: older,
                        attempt: first[0].attempts,
                        disposition: .retry(after: .seconds(10)),
                        attemptedAt: .now,
                        status: 500,
                        reason: "InternalServerError"
                    )
                ],
                workerID: "w1"
            )
            let newer = try await Self.keyed(db, key: "k")
            let batch = try await db.queue.claimBatch(limit: 10, workerID: "w2", lease: .seconds(30))
            #expect(batch.jobs.map(\.id) == [newer])
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE id = \(older) AND state = 'superseded' AND superseded_by = \(newer) AND locked_by IS NULL"
                ) == 1
            )
            // A reaped job's holder answers late: the fence sees the state and refuses it.
            let third = try await Self.keyed(db, key: "r")
            let held = try await db.queue.claim(limit: 1, workerID: "w3", lease: .seconds(30))
            #expect(held.map(\.id) == [third])
            try await db.execute(
                "UPDATE push.jobs SET state = 'pending', locked_until = NULL WHERE id = \(third)"
            )  // what the reaper does: locked_by kept
            let fourth = try await Self.keyed(db, key: "r")
            _ = try await db.queue.claim(limit: 10, workerID: "w4", lease: .seconds(30))
            let late = try await db.queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: third,
                        attempt: held[0].attempts,
                        disposition: .retry(after: .zero),
                        attemptedAt: .now,
                        status: 500,
                        reason: "InternalServerError"
                    )
                ],
                workerID: "w3"
            )
            #expect(late.fenced == [third])
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE id = \(third) AND state = 'superseded' AND superseded_by = \(fourth)"
                ) == 1
            )
        }
    }

    @Test(
        "latest wins over late commits: an older job whose transaction commits after the newer one was claimed is superseded, never sent; keys never meet across topics"
    )
    func latestWinsLateCommit() async throws {
        try await TestPostgres.withDatabase { db in
            let producer = try await Self.session(db)
            defer { Task { try? await producer.close() } }
            try await producer.query("BEGIN", logger: db.logger)
            var older: Int64 = 0
            for try await id in try await producer.query(
                PostgresQuery(
                    unsafeSQL:
                        "INSERT INTO push.jobs (topic, device_token, payload, coalesce_key) VALUES ('com.example.app', '\(Self.token)', '{\"aps\":{}}', 'k') RETURNING id"
                ),
                logger: db.logger
            ).decode(Int64.self) {
                older = id
            }
            let newer = try await Self.keyed(db, key: "k")
            let other = try await Self.keyed(db, key: "k", topic: "com.other.app")
            let first = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(30))
            #expect(Set(first.jobs.map(\.id)) == [newer, other], "the same key in another app is its own")
            try await producer.query("COMMIT", logger: db.logger)
            let second = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(30))
            #expect(second.jobs.isEmpty)
            #expect(second.superseded == 1)
            #expect(
                try await db.int64(
                    "SELECT superseded_by FROM push.jobs WHERE id = \(older) AND state = 'superseded'"
                ) == newer
            )
        }
    }

    @Test(
        "latest wins between claimers: a claim that took an older job while another claimer set a newer mark supersedes it instead of returning it"
    )
    func latestWinsBetweenClaimers() async throws {
        try await TestPostgres.withDatabase { db in
            let older = try await Self.keyed(db, key: "k")
            // Another claimer's mark, not yet committed (its claim of job older + 1000 is in flight).
            let other = try await Self.session(db)
            defer { Task { try? await other.close() } }
            try await other.query("BEGIN", logger: db.logger)
            try await other.query(
                "INSERT INTO push.coalesce_marks (topic, environment, coalesce_key, high_id) VALUES ('com.example.app', 'production', 'k', \(older + 1000))",
                logger: db.logger
            )
            let claim = Task { try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(30)) }
            // The claim's mark waits on the other claimer's (the key's one row): then sees it.
            var waited = false
            for _ in 0..<150 where !waited {
                waited =
                    try await db.int64(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    ) > 0
                if !waited { try await Task.sleep(for: .milliseconds(20)) }
            }
            #expect(waited)
            try await other.query("COMMIT", logger: db.logger)
            let batch = try await claim.value
            #expect(batch.jobs.isEmpty && batch.superseded == 1)
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE id = \(older) AND state = 'superseded' AND attempts = 0 AND locked_by IS NULL"
                ) == 1
            )
        }
    }
}
