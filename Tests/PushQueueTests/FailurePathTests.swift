import Foundation
import PostgresNIO
import PushCore
import PushQueue
import PushQueueTesting
import Testing

/// The queue's side of the failure paths: outcomes Postgres cannot store, heartbeats instead of bare
/// leases, late outcomes, bounded history. Each case here failed before the change.
@Suite("Failure paths in SQL")
struct FailurePathTests {
    @Test(
        "poison outcomes: a 3,000-hex token answered BadDeviceToken, a dead letter whose id is taken, a 410 timestamp of 9.3e15 ms: each is written, none throws"
    )
    func poisonOutcomes() async throws {
        try await TestPostgres.withDatabase { db in
            // Rows from before schema version 4 (which refuses such a token and explicit ids at INSERT).
            try await db.execute("ALTER TABLE push.jobs DROP CONSTRAINT device_token_must_be_hex_of_16_to_200_bytes")
            try await db.execute(
                """
                INSERT INTO push.jobs (id, topic, device_token, payload) OVERRIDING SYSTEM VALUE VALUES
                  (900001, 'com.example.app', repeat('ab', 1500), '{"aps":{}}'),
                  (900002, 'com.example.app', repeat('cd', 32), '{"aps":{}}'),
                  (900003, 'com.example.app', repeat('ef', 32), '{"aps":{}}')
                """
            )
            // A dead letter already holds id 900002 (a job re-enqueued by hand with an explicit id).
            try await db.execute(
                """
                INSERT INTO push.dead_jobs (id, topic, device_token, payload, push_type, environment, credential, run_at, apns_id,
                                            attempts, reason, created_at, error)
                VALUES (900002, 'com.example.app', repeat('cd', 32), '{"aps":{}}', 'alert', 'production', 'default', now(),
                        gen_random_uuid(), 1, 'BadTopic', now(), 'an older dead letter')
                """
            )
            let worker = workerName()
            let jobs = try await db.queue.claim(limit: 3, workerID: worker, lease: .seconds(30))
            #expect(jobs.count == 3)
            let outcomes = jobs.map { job -> JobOutcome in
                switch job.id {
                case 900001:
                    JobOutcome(
                        jobID: job.id,
                        attempt: 1,
                        disposition: .dead(sentence: "bad"),
                        attemptedAt: .now,
                        status: 400,
                        reason: "BadDeviceToken",
                        trapIDs: [.tokenEnvironment],
                        invalidatesToken: true
                    )
                case 900002:
                    JobOutcome(
                        jobID: job.id,
                        attempt: 1,
                        disposition: .dead(sentence: "topic"),
                        attemptedAt: .now,
                        status: 400,
                        reason: "BadTopic"
                    )
                default:
                    JobOutcome(
                        jobID: job.id,
                        attempt: 1,
                        disposition: .dead(sentence: "gone"),
                        attemptedAt: .now,
                        status: 410,
                        reason: "Unregistered",
                        trapIDs: [.tokenUnregistered],
                        invalidatesToken: true,
                        apnsTimestampMs: 9_300_000_000_000_000
                    )
                }
            }
            // One statement for the whole batch: before, any one of these made it throw, for ever.
            let result = try await db.queue.writeOutcomes(outcomes, workerID: worker)
            #expect(Set(result.recorded) == [900001, 900002, 900003])
            #expect(try await db.int64("SELECT count(*) FROM push.jobs") == 0)
            #expect(try await db.int64("SELECT count(*) FROM push.dead_jobs") == 3)
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.dead_jobs WHERE id = 900002 AND error LIKE '%was merged into this one%' AND history::text LIKE '%merged_dead_letter%'"
                ) == 1
            )
            // The 3,000-hex token is no token: no invalid-token row (it would not fit the index).
            #expect(
                try await db.int64("SELECT count(*) FROM push.invalid_tokens WHERE octet_length(device_token) > 512")
                    == 0
            )
            // The absurd timestamp is not stored as APNs' instant; the row says when the worker learnt it.
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.invalid_tokens WHERE apns_timestamp_ms IS NULL AND invalidated_at > now() - interval '1 minute'"
                ) == 1
            )
        }
    }

    @Test("the last resort writes one outcome as a dead letter with its sentence, without side effects, fenced")
    func unwritable() async throws {
        try await TestPostgres.withDatabase { db in
            let id = try await enqueue(db)[0]
            let worker = workerName()
            _ = try await db.queue.claim(limit: 1, workerID: worker, lease: .seconds(30))
            let outcome = JobOutcome(
                jobID: id,
                attempt: 1,
                disposition: .dead(sentence: "x"),
                attemptedAt: .now,
                status: 410,
                reason: "Unregistered",
                invalidatesToken: true
            )
            #expect(
                try await db.queue.deadLetterUnwritable(outcome, workerID: "someone-else", sentence: "s") == false,
                "fenced"
            )
            #expect(
                try await db.queue.deadLetterUnwritable(outcome, workerID: worker, sentence: "could not write") == true
            )
            #expect(
                try await db.int64("SELECT count(*) FROM push.dead_jobs WHERE id = \(id) AND error = 'could not write'")
                    == 1
            )
            #expect(try await db.int64("SELECT count(*) FROM push.invalid_tokens") == 0)
        }
    }

    @Test(
        "heartbeats: a live worker keeps its jobs whatever their leases say; a gone worker's jobs come back; a late outcome of a reaped job is accepted"
    )
    func heartbeats() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await enqueue(db, count: 4)
            let queue = db.queue
            let alive = workerName("alive")
            let gone = workerName("gone")
            let reaper = workerName("reaper")
            try await queue.heartbeat(workerID: alive, host: "h", pid: 1, credentials: ["default"])
            try await queue.heartbeat(workerID: gone, host: "h", pid: 2, credentials: ["default"])
            try await queue.heartbeat(workerID: reaper, host: "h", pid: 3, credentials: ["default"])
            // Both claim with leases that lapse at once (a Postgres outage longer than the lease).
            let mine = try await queue.claim(limit: 2, workerID: alive, lease: .milliseconds(1))
            let theirs = try await queue.claim(limit: 2, workerID: gone, lease: .milliseconds(1))
            // The gone worker's heartbeat an hour old, the staleness ten minutes: no wall-clock window for a
            // loaded machine to miss (the leases of 1 ms have lapsed by the time the next statement runs).
            try await db.execute(
                "UPDATE push.workers SET heartbeat_at = now() - interval '1 hour' WHERE worker_id = '\(gone)'"
            )
            try await db.execute("SELECT pg_sleep(0.01)")
            let reaped = try await queue.reapJobsOfGoneWorkers(
                staleAfter: .seconds(600),
                workerID: reaper,
                restartGrace: .zero
            )
            #expect(Set(reaped) == Set(theirs.map(\.id)), "only the gone worker's jobs")
            // The live worker's outcome is written although its lease lapsed.
            let written = try await queue.writeOutcomes(
                mine.map {
                    JobOutcome(
                        jobID: $0.id,
                        attempt: $0.attempts,
                        disposition: .delivered,
                        attemptedAt: .now,
                        status: 200
                    )
                },
                workerID: alive
            )
            #expect(written.recorded.count == 2)
            // The gone worker was only slow: its late outcome for a job reaped but not re-claimed stands.
            let late = try await queue.writeOutcomes(
                [JobOutcome(jobID: theirs[0].id, attempt: 1, disposition: .delivered, attemptedAt: .now, status: 200)],
                workerID: gone
            )
            #expect(late.recorded == [theirs[0].id])
            // Re-claimed by another: the old holder is fenced out.
            let again = try await queue.claim(limit: 1, workerID: reaper, lease: .seconds(30))
            #expect(again.map(\.id) == [theirs[1].id] && again[0].attempts == 2)
            let fenced = try await queue.writeOutcomes(
                [JobOutcome(jobID: theirs[1].id, attempt: 1, disposition: .delivered, attemptedAt: .now, status: 200)],
                workerID: gone
            )
            #expect(fenced.fenced == [theirs[1].id])
        }
    }

    @Test("a worker last seen before Postgres restarted is not taken for gone until the restart grace has passed")
    func restartGrace() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await enqueue(db, count: 1)
            let cutOff = workerName("cut-off")
            let reaper = workerName("reaper")
            try await db.queue.heartbeat(workerID: cutOff, host: "h", pid: 1, credentials: [])
            _ = try await db.queue.claim(limit: 1, workerID: cutOff, lease: .milliseconds(1))
            // Its last heartbeat predates the server's start (as after a restart).
            try await db.execute(
                "UPDATE push.workers SET heartbeat_at = pg_postmaster_start_time() - interval '1 second' WHERE worker_id = '\(cutOff)'"
            )
            #expect(
                try await db.queue.reapJobsOfGoneWorkers(
                    staleAfter: .milliseconds(1),
                    workerID: reaper,
                    restartGrace: .seconds(86_400)
                ).isEmpty
            )
            #expect(
                try await db.queue.reapJobsOfGoneWorkers(
                    staleAfter: .milliseconds(1),
                    workerID: reaper,
                    restartGrace: .zero
                ).count == 1
            )
        }
    }

    @Test("a restarted worker takes back its earlier life's jobs at once; claims only credentials it can sign")
    func restartAndCredentials() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await enqueue(db, count: 2)
            try await db.execute(
                "UPDATE push.jobs SET credential = 'brand-b' WHERE id = (SELECT max(id) FROM push.jobs)"
            )
            let worker = workerName()
            let first = try await db.queue.claim(
                limit: 5,
                workerID: worker,
                lease: .seconds(60),
                onlyCredentials: ["default"]
            )
            #expect(first.count == 1 && first[0].credential == "default")
            #expect(try await db.queue.reclaimPreviousLife(workerID: worker) == first.map(\.id))
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'pending'") == 2)
        }
    }

    @Test(
        "after a failover, the jobs the table says a worker runs but it does not hold (their claim's answer was lost) return to pending, the held ones and other workers' stay; the holder's late outcome is still accepted"
    )
    func releaseUnheldAfterFailover() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await enqueue(db, count: 6)
            let worker = workerName()
            let other = workerName()
            let mine = try await db.queue.claim(limit: 4, workerID: worker, lease: .seconds(60))
            let theirs = try await db.queue.claim(limit: 2, workerID: other, lease: .seconds(60))
            #expect(mine.count == 4 && theirs.count == 2)
            let held = Array(mine.prefix(2).map(\.id))
            let released = try await db.queue.releaseUnheld(workerID: worker, holding: held)
            #expect(Set(released) == Set(mine.suffix(2).map(\.id)))
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'running'") == 4)
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE state = 'pending' AND history::text LIKE '%failover%'"
                ) == 2
            )
            // Nothing held at all: every running job of the worker goes back.
            #expect(try await db.queue.releaseUnheld(workerID: worker, holding: []).count == 2)
            // A released job's outcome from its holder is still accepted until someone re-claims it.
            let late = try await db.queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: mine[3].id,
                        attempt: mine[3].attempts,
                        disposition: .delivered,
                        attemptedAt: .now,
                        status: 200
                    )
                ],
                workerID: worker
            )
            #expect(late.recorded.count == 1)
        }
    }

    @Test("requeues collapse in the history and the history is capped; expiry counts from the first request sent")
    func boundedHistory() async throws {
        try await TestPostgres.withDatabase { db in
            let id = try await enqueue(db)[0]
            let worker = workerName()
            for _ in 0..<300 {
                let job = try #require(try await db.queue.claim(limit: 1, workerID: worker, lease: .seconds(30)).first)
                _ = try await db.queue.writeOutcomes(
                    [
                        JobOutcome(
                            jobID: id,
                            attempt: job.attempts,
                            disposition: .requeue(after: .zero),
                            attemptedAt: .now,
                            reason: "ConnectFailed",
                            sent: false
                        )
                    ],
                    workerID: worker
                )
            }
            #expect(try await db.int64("SELECT jsonb_array_length(history) FROM push.jobs WHERE id = \(id)") == 1)
            #expect(
                try await db.int64("SELECT (history->0->>'repeats')::bigint FROM push.jobs WHERE id = \(id)") == 300
            )
            #expect(try await db.int64("SELECT attempts FROM push.jobs WHERE id = \(id)") == 0)
            #expect(
                try await db.int64("SELECT count(*) FROM push.jobs WHERE id = \(id) AND first_attempt_at IS NULL") == 1,
                "no request was sent"
            )
            for n in 0..<150 {
                let job = try #require(try await db.queue.claim(limit: 1, workerID: worker, lease: .seconds(30)).first)
                _ = try await db.queue.writeOutcomes(
                    [
                        JobOutcome(
                            jobID: id,
                            attempt: job.attempts,
                            disposition: .transportRetry(after: .zero),
                            attemptedAt: .now,
                            reason: n % 2 == 0 ? "Timeout" : "ConnectionReset"
                        )
                    ],
                    workerID: worker
                )
            }
            #expect(try await db.int64("SELECT jsonb_array_length(history) FROM push.jobs WHERE id = \(id)") <= 101)
            // The first 20 entries stay (the collapsed requeues first), then the marker, then the newest.
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE id = \(id) AND history->0->>'outcome' = 'requeue' AND history->20->>'outcome' = 'history_trimmed' AND history->-1->>'outcome' = 'transport_retry' AND (history->-1->>'attempt')::int = 1"
                ) == 1
            )
            #expect(try await db.int64("SELECT transport_retries FROM push.jobs WHERE id = \(id)") == 150)
            #expect(
                try await db.int64("SELECT count(*) FROM push.jobs WHERE id = \(id) AND first_attempt_at IS NOT NULL")
                    == 1
            )
        }
    }
}
