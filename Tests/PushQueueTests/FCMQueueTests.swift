import Foundation
import PostgresNIO
import PushCore
import PushQueue
import PushQueueTesting
import Testing

/// Every queue feature with platform fcm rows, against real Postgres: idempotent enqueue, coalescing (kept
/// apart from APNs' jobs of the same app and key), pauses, rate limits, fair share, cancel, dead letters and
/// replay, retention, and the claim's pairs that keep the platforms' credentials apart.
@Suite("FCM rows through the queue: every control as for APNs")
struct FCMQueueTests {
    static func fcm(_ db: TestDatabase, _ values: String) async throws -> [Int64] {
        try await db.int64s(
            PostgresQuery(
                unsafeSQL: """
                    INSERT INTO push.jobs (platform, topic, device_token, payload, coalesce_key, apns_id)
                    VALUES \(values) RETURNING id
                    """
            )
        )
    }

    @Test(
        "idempotent enqueue by apns_id, and latest wins within fcm only: an iOS job of the same app and key is not superseded"
    )
    func idempotenceAndCoalescing() async throws {
        try await TestPostgres.withDatabase { db in
            let id = UUID()
            let first = try await Self.fcm(db, "('fcm', 'com.example.app', 'a:1', '{}', 'score', '\(id)')")
            let again = try await Self.fcm(db, "('fcm', 'com.example.app', 'a:1', '{}', 'score', '\(id)')")
            #expect(first.count == 1 && again.isEmpty, "the second INSERT with the same apns_id is skipped")
            let newer = try await Self.fcm(db, "('fcm', 'com.example.app', 'a:1', '{}', 'score', gen_random_uuid())")
            // The iOS app of the same id, the same key: APNs' own scope.
            let ios = try await db.int64s(
                "INSERT INTO push.jobs (topic, device_token, payload, coalesce_key) VALUES ('com.example.app', repeat('ab', 32), '{\"aps\":{}}', 'score') RETURNING id"
            )
            let batch = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(Set(batch.jobs.map(\.id)) == Set(newer + ios), "the newest of each platform's key")
            #expect(batch.superseded == 1)
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE id = \(first[0]) AND state = 'superseded' AND superseded_by = \(newer[0])"
                ) == 1
            )
            #expect(batch.jobs.first { $0.id == newer[0] }?.platform == .fcm)
            #expect(batch.jobs.first { $0.id == ios[0] }?.platform == .apns)
        }
    }

    @Test(
        "pauses by topic and credential, rate limits, and a worker without FCM credentials (its fcm pairs left out) hold fcm jobs uncounted"
    )
    func pausesLimitsAndPairs() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await db.int64s(
                """
                INSERT INTO push.jobs (platform, topic, device_token, payload)
                SELECT 'fcm', 'com.example.app', 'tok:' || g, '{}' FROM generate_series(1, 20) g RETURNING id
                """
            )
            // A worker that has only an APNs 'default' leaves the fcm pair out: nothing is claimed.
            let apnsOnly = try await db.queue.claimBatch(
                limit: 10,
                workerID: "w",
                lease: .seconds(60),
                onlyCredentials: ["default"],
                excluding: ClaimExclusions(endpoints: [EndpointKey(environment: "fcm", credential: "default")])
            )
            #expect(apnsOnly.jobs.isEmpty)
            // A pause of the topic holds them.
            try await db.queue.operations.pause(credential: nil, topic: "com.example.app", reason: "test")
            #expect(try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60)).jobs.isEmpty)
            try await db.execute("DELETE FROM push.pauses")
            // A limit of 2/s with burst 3 lets three through now.
            try await db.queue.operations.setRateLimit(credential: "default", topic: nil, perSecond: 2, burst: 3)
            let limited = try await db.queue.claimBatch(limit: 20, workerID: "w", lease: .seconds(60))
            #expect(limited.jobs.count <= 3 && !limited.jobs.isEmpty, "\(limited.jobs.count)")
            #expect(limited.jobs.allSatisfy { $0.sendSpacing != nil && $0.platform == .fcm })
            #expect(try await db.int64("SELECT max(attempts) FROM push.jobs WHERE state = 'pending'") == 0)
        }
    }

    @Test("fair share: 2,000 fcm jobs of one credential do not hold back another's APNs jobs beyond one claim")
    func fairShare() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await db.int64s(
                """
                INSERT INTO push.jobs (platform, topic, device_token, payload)
                SELECT 'fcm', 'com.example.app', 'tok:' || g, '{}' FROM generate_series(1, 2000) g RETURNING id
                """
            )
            let ios = try await db.int64s(
                """
                INSERT INTO push.jobs (topic, device_token, payload, credential)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{}}', 'brand-b' FROM generate_series(1, 5) g RETURNING id
                """
            )
            let batch = try await db.queue.claimBatch(limit: 250, workerID: "w", lease: .seconds(60))
            #expect(Set(ios).isSubset(of: Set(batch.jobs.map(\.id))), "B's five go out in the first claim")
        }
    }

    @Test("cancel, dead letter, replay (platform, environment and apns_id kept) and retention, for fcm jobs")
    func cancelDeadReplayRetention() async throws {
        try await TestPostgres.withDatabase { db in
            let ids = try await db.int64s(
                """
                INSERT INTO push.jobs (platform, topic, device_token, payload)
                SELECT 'fcm', 'com.example.app', 'tok:' || g, '{}' FROM generate_series(1, 3) g RETURNING id
                """
            )
            let cancelled = try await db.queue.cancel(ids: [ids[2]])
            #expect(cancelled.cancelled.count == 1)
            let batch = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(Set(batch.jobs.map(\.id)) == Set(ids.prefix(2)))
            let apnsID = try #require(batch.jobs.first { $0.id == ids[0] }?.apnsID)
            _ = try await db.queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: ids[0],
                        attempt: 1,
                        disposition: .dead(sentence: "FCM says the registration token is no longer valid"),
                        attemptedAt: .now,
                        status: 404,
                        reason: "UNREGISTERED",
                        trapIDs: [.fcmTokenUnregistered],
                        invalidatesToken: true
                    ),
                    JobOutcome(
                        jobID: ids[1],
                        attempt: 1,
                        disposition: .delivered,
                        attemptedAt: .now,
                        status: 200,
                        reason: nil,
                        apnsUniqueID: "projects/p/messages/1"
                    ),
                ],
                workerID: "w"
            )
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.dead_jobs WHERE id = \(ids[0]) AND platform = 'fcm' AND environment = 'fcm'"
                ) == 1
            )
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.invalid_tokens WHERE platform = 'fcm' AND device_token = 'tok:1'"
                ) == 1
            )
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE id = \(ids[1]) AND provider_message_id = 'projects/p/messages/1' AND apns_unique_id IS NULL"
                ) == 1
            )
            let replayed = try await db.queue.operations.replay(matching: .init(ids: [ids[0]]))
            #expect(replayed.moved.map(\.id) == [ids[0]] && replayed.moved.first?.apnsID == apnsID)
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE id = \(ids[0]) AND platform = 'fcm' AND environment = 'fcm' AND state = 'pending'"
                ) == 1
            )
            try await db.execute("UPDATE push.jobs SET delivered_at = now() - interval '8 days' WHERE id = \(ids[1])")
            #expect(try await db.queue.pruneDelivered(olderThan: .seconds(7 * 86_400)) == 1)
        }
    }
}
