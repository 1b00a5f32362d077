import Foundation
import PostgresNIO
import PushCore
import PushQueue
import PushQueueTesting
import Testing

@Suite("Dead letters: list, replay, purge")
struct DeadLetterTests {
    /// Enqueues `count` jobs and dead-letters them with the given reason and trap.
    func kill(
        _ db: TestDatabase,
        count: Int,
        topic: String = "com.example.app",
        reason: String,
        trap: TrapID?
    ) async throws -> [PushJob] {
        _ = try await enqueue(db, count: count, topic: topic)
        let worker = workerName()
        let jobs = try await db.queue.claim(limit: count, workerID: worker, lease: .seconds(30))
        let result = try await db.queue.writeOutcomes(
            jobs.map {
                JobOutcome(
                    jobID: $0.id,
                    attempt: $0.attempts,
                    disposition: .dead(sentence: "dead: \(reason)"),
                    attemptedAt: .now,
                    status: 400,
                    reason: reason,
                    trapIDs: trap.map { [$0] } ?? []
                )
            },
            workerID: worker
        )
        #expect(result.recorded.count == count)
        return jobs
    }

    @Test("listing filters by trap, reason, topic, time and limit")
    func listing() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await kill(db, count: 3, reason: "BadDeviceToken", trap: .tokenEnvironment)
            _ = try await kill(
                db,
                count: 2,
                topic: "com.example.other",
                reason: "PayloadTooLarge",
                trap: .payloadTooLarge
            )
            _ = try await kill(db, count: 1, reason: "BadPriority", trap: nil)
            let queue = db.queue
            #expect(try await queue.operations.deadLetters(matching: .init()).count == 6)
            #expect(try await queue.operations.deadLetters(matching: .init(trapID: "MS014")).count == 3)
            #expect(try await queue.operations.deadLetters(matching: .init(reason: "PayloadTooLarge")).count == 2)
            #expect(
                try await queue.operations.deadLetters(matching: .init(topic: "com.example.other")).allSatisfy {
                    $0.reason == "PayloadTooLarge"
                }
            )
            #expect(try await queue.operations.deadLetters(matching: .init(limit: 4)).count == 4)
            #expect(
                try await queue.operations.deadLetters(matching: .init(since: Date().addingTimeInterval(3600))).isEmpty
            )
            #expect(
                try await queue.operations.deadLetters(matching: .init(before: Date().addingTimeInterval(3600))).count
                    == 6
            )
            let newest = try await queue.operations.deadLetters(matching: .init())
            #expect(newest.map(\.deadAt) == newest.map(\.deadAt).sorted(by: >))
            let stats = try await queue.operations.stats()
            #expect(stats.deadLetters == 6)
            #expect(stats.deadByTrap == ["MS014": 3, "MS011": 2, "none": 1])
            #expect(stats.deadLastMinute == 6)
        }
    }

    @Test("replay moves dead letters back as pending with the same apns_id, attempts reset, history kept")
    func replayKeepsAPNsID() async throws {
        try await TestPostgres.withDatabase { db in
            let jobs = try await kill(db, count: 3, reason: "BadDeviceToken", trap: .tokenEnvironment)
            let queue = db.queue
            let dry = try await queue.operations.replay(matching: .init(ids: [jobs[0].id]), dryRun: true)
            #expect(dry.dryRun)
            #expect(dry.moved.map(\.id) == [jobs[0].id])
            #expect(try await db.int64("SELECT count(*) FROM push.dead_jobs") == 3, "a dry run moves nothing")

            let result = try await queue.operations.replay(matching: .init(ids: [jobs[0].id, jobs[1].id]))
            #expect(result.moved.map(\.id) == [jobs[0].id, jobs[1].id])
            #expect(result.moved.map(\.apnsID) == [jobs[0].apnsID, jobs[1].apnsID])
            #expect(try await db.int64("SELECT count(*) FROM push.dead_jobs") == 1)
            let record = try #require(try await queue.operations.job(id: jobs[0].id))
            #expect(record.state == .pending)
            #expect(record.job.attempts == 0)
            #expect(record.job.apnsID == jobs[0].apnsID)
            #expect(record.status == nil && record.reason == nil && record.job.trapIDs.isEmpty)
            #expect(record.historyJSON.contains("\"replayed\""))
            #expect(record.historyJSON.contains("\"dead\""))

            // The replayed job is claimable and sends with its original apns_id.
            let again = try await queue.claim(limit: 5, workerID: workerName(), lease: .seconds(30))
            #expect(Set(again.map(\.apnsID)) == Set([jobs[0].apnsID, jobs[1].apnsID]))
        }
    }

    @Test("replay with a new apns_id; conflicts are skipped, never dropped; --all-style selection")
    func replayNewAPNsIDAndConflicts() async throws {
        try await TestPostgres.withDatabase { db in
            let jobs = try await kill(db, count: 2, reason: "Unregistered", trap: .tokenUnregistered)
            // A producer's outbox retried the first job with the same apns_id while it was dead: skipped.
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, apns_id)
                VALUES ('com.example.app', repeat('cafe', 16), '{"aps":{}}', '\(jobs[0].apnsID.uuidString)')
                """
            )
            #expect(try await db.int64("SELECT count(*) FROM push.jobs") == 0, "a dead letter's apns_id stays spent")
            // A job from before schema version 4 (no skip at INSERT then) holds the same apns_id.
            try await db.execute("ALTER TABLE push.jobs DISABLE TRIGGER jobs_before_insert")
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, apns_id)
                VALUES ('com.example.app', repeat('cafe', 16), '{"aps":{}}', '\(jobs[0].apnsID.uuidString)')
                """
            )
            try await db.execute("ALTER TABLE push.jobs ENABLE TRIGGER jobs_before_insert")
            let queue = db.queue
            let result = try await queue.operations.replay(matching: .init(trapID: "MS020"))
            #expect(result.moved.map(\.id) == [jobs[1].id])
            #expect(result.skippedConflicts == [jobs[0].id])
            #expect(try await queue.operations.deadLetter(id: jobs[0].id) != nil, "the conflicting dead letter stays")

            let fresh = try await queue.operations.replay(matching: .init(ids: [jobs[0].id]), newAPNsID: true)
            #expect(fresh.moved.count == 1)
            #expect(fresh.moved[0].apnsID != jobs[0].apnsID)
            #expect(try await db.int64("SELECT count(*) FROM push.dead_jobs") == 0)
            #expect(try await db.int64("SELECT count(*) FROM push.jobs") == 3)
        }
    }

    @Test("purge deletes dead letters older than the cut-off only")
    func purge() async throws {
        try await TestPostgres.withDatabase { db in
            let jobs = try await kill(db, count: 5, reason: "BadTopic", trap: nil)
            try await db.execute(
                "UPDATE push.dead_jobs SET dead_at = now() - interval '40 days' WHERE id IN (\(jobs[0].id), \(jobs[1].id), \(jobs[2].id))"
            )
            let purged = try await db.queue.operations.purgeDeadLetters(olderThan: .seconds(30 * 86_400), batchSize: 2)
            #expect(purged == 3)
            #expect(try await db.int64s("SELECT id FROM push.dead_jobs ORDER BY id") == [jobs[3].id, jobs[4].id])
        }
    }
}
