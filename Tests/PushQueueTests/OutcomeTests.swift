import Foundation
import PostgresNIO
import PushCore
import PushQueue
import PushQueueTesting
import Testing

@Suite("Recording outcomes")
struct OutcomeTests {
    @Test("a worker whose lease was lost cannot overwrite the newer attempt")
    func fencedWrite() async throws {
        try await TestPostgres.withDatabase { db in
            let id = try await enqueue(db)[0]
            let queue = db.queue
            let stale = try await queue.claim(limit: 1, workerID: "stale", lease: .milliseconds(1))[0]
            // Wait for the lease to run out, then let the reaper return the job.
            var reaped: [Int64] = []
            for _ in 0..<200 where reaped.isEmpty {
                reaped = try await queue.reapJobsOfGoneWorkers(staleAfter: .seconds(6), workerID: "reaper")
                if reaped.isEmpty { try await Task.sleep(for: .milliseconds(10)) }
            }
            #expect(reaped == [id])
            let fresh = try await queue.claim(limit: 1, workerID: "fresh", lease: .seconds(30))[0]
            #expect(fresh.attempts == 2)
            #expect(fresh.apnsID == stale.apnsID)

            let late = try await queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: id,
                        attempt: stale.attempts,
                        disposition: .dead(sentence: "stale"),
                        attemptedAt: .now,
                        status: 410,
                        reason: "Unregistered"
                    )
                ],
                workerID: "stale"
            )
            #expect(late.recorded.isEmpty)
            #expect(late.fenced == [id])
            // The same attempt number from the wrong worker is refused too.
            let impostor = try await queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: id,
                        attempt: fresh.attempts,
                        disposition: .delivered,
                        attemptedAt: .now,
                        status: 200
                    )
                ],
                workerID: "stale"
            )
            #expect(impostor.fenced == [id])
            #expect(try await db.int64("SELECT count(*) FROM push.dead_jobs") == 0)

            let current = try await queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: id,
                        attempt: fresh.attempts,
                        disposition: .delivered,
                        attemptedAt: .now,
                        status: 200,
                        apnsUniqueID: "u-1",
                        latencyMs: 12
                    )
                ],
                workerID: "fresh"
            )
            #expect(current.recorded == [id])
            let record = try #require(try await queue.operations.job(id: id))
            #expect(record.state == .delivered)
            #expect(record.status == 200)
            #expect(record.apnsUniqueID == "u-1")
            #expect(record.latencyMs == 12)
            #expect(record.deliveredAt != nil)
            #expect(record.lockedBy == nil)
            // A second write of the same outcome is fenced: the job is no longer running.
            let again = try await queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: id,
                        attempt: fresh.attempts,
                        disposition: .delivered,
                        attemptedAt: .now,
                        status: 200
                    )
                ],
                workerID: "fresh"
            )
            #expect(again.fenced == [id])
        }
    }

    @Test("a retry returns the job to pending at the given time with the same apns_id, trap ids merged")
    func retry() async throws {
        try await TestPostgres.withDatabase { db in
            let id = try await enqueue(db)[0]
            let queue = db.queue
            let worker = workerName()
            let first = try await queue.claim(limit: 1, workerID: worker, lease: .seconds(30))[0]
            let writeStarted = ContinuousClock.now
            let result = try await queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: id,
                        attempt: 1,
                        disposition: .retry(after: .seconds(3600)),
                        attemptedAt: .now,
                        status: 429,
                        reason: "TooManyRequests",
                        trapIDs: [.priorityBudget],
                        latencyMs: 5
                    )
                ],
                workerID: worker
            )
            #expect(result.recorded == [id])
            let record = try #require(try await queue.operations.job(id: id))
            #expect(record.state == .pending)
            // The delay is added to Postgres's clock, not the worker's: an hour from the write, which began no
            // longer ago than this test has waited since (seconds, on a machine the parallel suite loads).
            let dueIn = try await db.double(
                "SELECT extract(epoch FROM run_at - now())::float8 FROM push.jobs WHERE id = \(id)"
            )
            let since = (ContinuousClock.now - writeStarted) / .seconds(1)
            #expect(dueIn <= 3600 && dueIn >= 3600 - since - 0.5, "due in \(dueIn) s, \(since) s after the write began")
            #expect(record.job.apnsID == first.apnsID)
            #expect(record.status == 429)
            #expect(record.reason == "TooManyRequests")
            #expect(record.job.trapIDs == [.priorityBudget])
            #expect(record.job.attempts == 1)
            // Not due yet: nothing to claim.
            #expect(try await queue.claim(limit: 10, workerID: worker, lease: .seconds(30)).isEmpty)

            // Due again: the second attempt carries the same apns_id; trap ids stay distinct, first seen first.
            try await db.execute("UPDATE push.jobs SET run_at = now() WHERE id = \(id)")
            let second = try await queue.claim(limit: 1, workerID: worker, lease: .seconds(30))[0]
            #expect(second.apnsID == first.apnsID)
            #expect(second.attempts == 2)
            _ = try await queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: id,
                        attempt: 2,
                        disposition: .retry(after: .zero),
                        attemptedAt: .now,
                        status: 503,
                        reason: "ServiceUnavailable",
                        trapIDs: [.priorityBudget, .payloadTooLarge]
                    )
                ],
                workerID: worker
            )
            let third = try await queue.claim(limit: 1, workerID: worker, lease: .seconds(30))[0]
            _ = try await queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: id,
                        attempt: third.attempts,
                        disposition: .delivered,
                        attemptedAt: .now,
                        status: 200
                    )
                ],
                workerID: worker
            )
            let done = try #require(try await queue.operations.job(id: id))
            #expect(done.state == .delivered)
            #expect(done.job.trapIDs == [.priorityBudget, .payloadTooLarge])
            #expect(done.reason == "ServiceUnavailable", "reason keeps the last failure")
            let history = try JSONSerialization.jsonObject(with: Data(done.historyJSON.utf8)) as? [[String: Any]]
            #expect(history?.map { $0["outcome"] as? String } == ["retry", "retry", "delivered"])
            #expect(history?.map { $0["attempt"] as? Int } == [1, 2, 3])
        }
    }

    @Test(
        "a dead-letter move keeps every producer column, the apns_id and the history, and leaves nothing in push.jobs"
    )
    func deadLetterMove() async throws {
        try await TestPostgres.withDatabase { db in
            let apnsID = UUID()
            let id = try await db.int64(
                """
                INSERT INTO push.jobs (topic, device_token, payload, push_type, priority, environment, credential,
                                       collapse_id, expires_at, run_at, apns_id, max_attempts)
                VALUES ('com.example.app', repeat('abcdef0123', 64 / length('abcdef0123')), '{"aps":{"alert":"x"},"k":1}', 'alert', 10, 'development',
                        'team-b', 'order-42', '2030-01-01T00:00:00Z', now() - interval '1 second', \(apnsID), 3)
                RETURNING id
                """
            )
            let before = try await db.int64s("SELECT 1")  // keep the connection warm
            #expect(before == [1])
            // run_at is the producer's until the first retry reschedules it (CONTRACT.md), so it is not compared.
            let producerColumns =
                "topic, device_token, channel_id, payload, push_type, priority, environment, credential, collapse_id, expires_at, apns_id, max_attempts, created_at"
            let original = try await db.client.query(
                PostgresQuery(
                    unsafeSQL:
                        "SELECT row_to_json(x)::text FROM (SELECT id, \(producerColumns) FROM push.jobs WHERE id = \(id)) x"
                )
            ).decode(String.self).collect()

            let queue = db.queue
            let worker = workerName()
            _ = try await queue.claim(limit: 1, workerID: worker, lease: .seconds(30))
            _ = try await queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: id,
                        attempt: 1,
                        disposition: .retry(after: .zero),
                        attemptedAt: .now,
                        status: 500,
                        reason: "InternalServerError"
                    )
                ],
                workerID: worker
            )
            _ = try await queue.claim(limit: 1, workerID: worker, lease: .seconds(30))
            let result = try await queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: id,
                        attempt: 2,
                        disposition: .dead(sentence: "The device token is no longer valid: drop it."),
                        attemptedAt: .now,
                        status: 410,
                        reason: "Unregistered",
                        trapIDs: [.tokenUnregistered],
                        latencyMs: 7,
                        invalidatesToken: true,
                        apnsTimestampMs: 1_700_000_000_123
                    )
                ],
                workerID: worker
            )
            #expect(result.recorded == [id])
            #expect(try await db.int64("SELECT count(*) FROM push.jobs") == 0)

            let moved = try await db.client.query(
                PostgresQuery(
                    unsafeSQL:
                        "SELECT row_to_json(x)::text FROM (SELECT id, \(producerColumns) FROM push.dead_jobs WHERE id = \(id)) x"
                )
            ).decode(String.self).collect()
            #expect(moved == original)

            let letter = try #require(try await queue.operations.deadLetter(id: id))
            #expect(letter.job.apnsID == apnsID)
            #expect(letter.job.attempts == 2)
            #expect(letter.status == 410)
            #expect(letter.reason == "Unregistered")
            #expect(letter.job.trapIDs == [.tokenUnregistered])
            #expect(letter.error == "The device token is no longer valid: drop it.")
            let history = try JSONSerialization.jsonObject(with: Data(letter.historyJSON.utf8)) as? [[String: Any]]
            #expect(history?.map { $0["status"] as? Int } == [500, 410])
            #expect(history?.last?["trap_ids"] as? [String] == ["MS020"])

            let token = try await db.client.query(
                """
                SELECT reason, apns_timestamp_ms, (extract(epoch FROM invalidated_at) * 1000)::bigint, job_id, environment
                  FROM push.invalid_tokens WHERE device_token = repeat('abcdef0123', 6) AND topic = 'com.example.app'
                """
            ).decode((String, Int64, Int64, Int64, String).self).collect()
            #expect(token.count == 1)
            #expect(token.first?.0 == "Unregistered")
            #expect(token.first?.1 == 1_700_000_000_123)
            #expect(token.first?.2 == 1_700_000_000_123, "invalidated_at holds APNs' timestamp to the millisecond")
            #expect(token.first?.3 == id)
            #expect(token.first?.4 == "development")
        }
    }

    @Test("invalid tokens: one row per token, the newest invalidation wins, BadDeviceToken gets now()")
    func invalidTokenUpsert() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload) VALUES
                ('com.example.app', repeat('feed', 64 / length('feed')), '{"aps":{}}'), ('com.example.app', repeat('feed', 64 / length('feed')), '{"aps":{}}'),
                ('com.example.app', repeat('beef', 64 / length('beef')), '{"aps":{}}')
                """
            )
            let worker = workerName()
            let jobs = try await db.queue.claim(limit: 3, workerID: worker, lease: .seconds(30))
            let outcomes = jobs.map { job in
                job.deviceToken == String(repeating: "beef", count: 16)
                    ? JobOutcome(
                        jobID: job.id,
                        attempt: 1,
                        disposition: .dead(sentence: "bad"),
                        attemptedAt: .now,
                        status: 400,
                        reason: "BadDeviceToken",
                        trapIDs: [.tokenEnvironment],
                        invalidatesToken: true
                    )
                    : JobOutcome(
                        jobID: job.id,
                        attempt: 1,
                        disposition: .dead(sentence: "gone"),
                        attemptedAt: .now,
                        status: 410,
                        reason: "Unregistered",
                        trapIDs: [.tokenUnregistered],
                        invalidatesToken: true,
                        apnsTimestampMs: job.id == jobs[0].id ? 1_700_000_001_000 : 1_700_000_002_000
                    )
            }
            let result = try await db.queue.writeOutcomes(outcomes, workerID: worker)
            #expect(result.recorded.count == 3)
            let rows = try await db.client.query(
                "SELECT device_token, reason, coalesce(apns_timestamp_ms, -1), invalidated_at > now() - interval '1 minute' FROM push.invalid_tokens ORDER BY device_token"
            ).decode((String, String, Int64, Bool).self).collect()
            #expect(rows.count == 2)
            #expect(
                rows[0].0 == String(repeating: "beef", count: 16) && rows[0].1 == "BadDeviceToken" && rows[0].2 == -1
                    && rows[0].3
            )
            #expect(rows[1].0 == String(repeating: "feed", count: 16) && rows[1].2 == 1_700_000_002_000)
        }
    }

    @Test("expired leases are reclaimed with the same apns_id; a worker's unsent claims are released uncounted")
    func leases() async throws {
        try await TestPostgres.withDatabase { db in
            let ids = try await enqueue(db, count: 4)
            let queue = db.queue
            let dead = try await queue.claim(limit: 2, workerID: "crashed", lease: .milliseconds(1))
            let alive = try await queue.claim(limit: 2, workerID: "alive", lease: .seconds(60))
            var reaped: [Int64] = []
            for _ in 0..<200 where reaped.isEmpty {
                reaped = try await queue.reapJobsOfGoneWorkers(staleAfter: .seconds(6), workerID: "reaper")
                if reaped.isEmpty { try await Task.sleep(for: .milliseconds(10)) }
            }
            #expect(Set(reaped) == Set(dead.map(\.id)))
            let released = try await queue.release(alive.map { ($0.id, $0.attempts) }, workerID: "alive")
            #expect(released == 2)
            let again = try await queue.claim(limit: 10, workerID: "next", lease: .seconds(60))
            #expect(Set(again.map(\.id)) == Set(ids))
            for job in again {
                let previous = (dead + alive).first { $0.id == job.id }
                #expect(job.apnsID == previous?.apnsID)
                // Reaped jobs keep their unknown attempt counted; released ones were never sent.
                #expect(job.attempts == (dead.contains { $0.id == job.id } ? 2 : 1))
            }
            #expect(
                try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'running' AND locked_by = 'next'") == 4
            )
        }
    }

    @Test("delivered rows past retention are pruned in bounded batches; recent and pending ones stay")
    func prune() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await enqueue(db, count: 25)
            let worker = workerName()
            let jobs = try await db.queue.claim(limit: 20, workerID: worker, lease: .seconds(30))
            _ = try await db.queue.writeOutcomes(
                jobs.map {
                    JobOutcome(jobID: $0.id, attempt: 1, disposition: .delivered, attemptedAt: .now, status: 200)
                },
                workerID: worker
            )
            try await db.execute(
                "UPDATE push.jobs SET delivered_at = now() - interval '8 days' WHERE id IN (SELECT id FROM push.jobs WHERE state = 'delivered' ORDER BY id LIMIT 15)"
            )
            let pruned = try await db.queue.pruneDelivered(olderThan: .seconds(7 * 86_400), batchSize: 4)
            #expect(pruned == 15)
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 5)
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'pending'") == 5)
        }
    }
}

extension Date {
    /// Whole seconds, so a round trip through timestamptz compares equal.
    func rounded() -> Date { Date(timeIntervalSince1970: self.timeIntervalSince1970.rounded(.down)) }
}

extension AsyncSequence where Self: Sendable {
    func collect() async throws -> [Element] {
        var values: [Element] = []
        for try await value in self { values.append(value) }
        return values
    }
}
