import Foundation
import PostgresNIO
import PushQueueTesting
import Testing

@testable import PushQueue

/// The minute's prunes, run by every worker, read only what they delete: a large outbox or a large set of
/// latest-wins marks with nothing to prune costs a few buffers, not a pass over the table.
@Suite("Prunes: read through their indexes, whatever the table holds")
struct PruneTests {
    /// Buffers one statement reads under EXPLAIN ANALYZE, with the worker's session settings.
    static func buffers(_ db: TestDatabase, _ query: PostgresQuery) async throws -> (total: Int, plan: String) {
        try await db.client.withConnection { connection in
            for setting in JobQueue.workerSessionSettings {
                try await connection.query(
                    PostgresQuery(unsafeSQL: "SET \(setting.0) = '\(setting.1)'"),
                    logger: db.logger
                )
            }
            try await connection.query("BEGIN", logger: db.logger)
            var text = ""
            for try await line in try await connection.query(
                PostgresQuery(unsafeSQL: "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) \(query.sql)", binds: query.binds),
                logger: db.logger
            ).decode(String.self) {
                text += line
            }
            try await connection.query("ROLLBACK", logger: db.logger)
            let json = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [[String: Any]]
            let plan = json?.first?["Plan"] as? [String: Any] ?? [:]
            let total = (plan["Shared Hit Blocks"] as? Int ?? 0) + (plan["Shared Read Blocks"] as? Int ?? 0)
            return (total, text)
        }
    }

    @Test(
        "the outbox prunes and the coalesce-marks prune read a few buffers from 100,000 rows with nothing to prune (each read the whole table before schema 14)"
    )
    func prunesUseTheirIndexes() async throws {
        try await TestPostgres.withDatabase { db in
            let hook = try await db.int64(
                "INSERT INTO push.webhooks (url, events, secret_file) VALUES ('https://hooks.example.com/h', '{dead}', '/etc/push/secret') RETURNING id"
            )
            // 100,000 deliveries: pending, freshly delivered and freshly dead; none past retention.
            try await db.execute(
                """
                INSERT INTO push.webhook_deliveries (webhook_id, event, job_id, body, state, delivered_at)
                SELECT \(hook), 'dead', g, '{}', CASE g % 3 WHEN 0 THEN 'pending' WHEN 1 THEN 'delivered' ELSE 'dead' END,
                       CASE WHEN g % 3 = 1 THEN now() END
                  FROM generate_series(1, 100000) AS g
                """
            )
            try await db.execute(
                """
                INSERT INTO push.coalesce_marks (topic, environment, coalesce_key, high_id)
                SELECT 'com.example.app', 'production', 'key-' || g, g FROM generate_series(1, 100000) AS g
                """
            )
            try await db.execute("VACUUM ANALYZE push.webhook_deliveries")
            try await db.execute("VACUUM ANALYZE push.coalesce_marks")
            for query in JobQueue.webhookPrunes(retentionSeconds: 86_400, batchSize: 5_000) {
                let (total, plan) = try await Self.buffers(db, query)
                #expect(total < 50, "\(total) buffers: \(plan.prefix(1500))")
            }
            let (marks, plan) = try await Self.buffers(
                db,
                JobsSQL.forgetCoalesceMarks.query {
                    $0.bind("age_seconds", 86_400.0)
                    $0.bind("batch_size", Int64(5_000))
                }
            )
            #expect(marks < 50, "\(marks) buffers: \(plan.prefix(1500))")
            // And they delete what is due.
            try await db.execute(
                "UPDATE push.webhook_deliveries SET delivered_at = now() - interval '2 days' WHERE id % 3 = 1 AND id < 3000"
            )
            try await db.execute(
                "UPDATE push.coalesce_marks SET updated_at = now() - interval '2 days' WHERE high_id <= 10"
            )
            #expect(try await db.queue.pruneWebhookDeliveries(olderThan: .seconds(86_400)) == 1_000)
            try await db.queue.forgetRetiredAPNsIDs(olderThan: .seconds(86_400))
            #expect(try await db.int64("SELECT count(*) FROM push.coalesce_marks") == 99_990)
        }
    }

    @Test(
        "a disabled hook's pending deliveries become dead with the reason (they waited for ever); replay sends them again"
    )
    func disabledHookDeliveriesEnd() async throws {
        try await TestPostgres.withDatabase { db in
            let hook = try await db.int64(
                "INSERT INTO push.webhooks (url, events, secret_file) VALUES ('https://hooks.example.com/h', '{dead}', '/etc/push/secret') RETURNING id"
            )
            let other = try await db.int64(
                "INSERT INTO push.webhooks (url, events, secret_file) VALUES ('https://hooks.example.com/o', '{dead}', '/etc/push/secret') RETURNING id"
            )
            try await db.execute(
                "INSERT INTO push.webhook_deliveries (webhook_id, event, job_id, body) SELECT h, 'dead', g, '{}' FROM generate_series(1, 10) AS g, unnest(ARRAY[\(hook), \(other)]) AS h"
            )
            try await db.execute(
                "UPDATE push.webhooks SET disabled_at = now(), disabled_reason = 'the receiver answered 410 Gone' WHERE id = \(hook)"
            )
            try await db.queue.pruneWebhookDeliveries(olderThan: .seconds(86_400))
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.webhook_deliveries WHERE webhook_id = \(hook) AND state = 'dead' AND last_error LIKE '%410 Gone%webhooks replay%'"
                ) == 10
            )
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.webhook_deliveries WHERE webhook_id = \(other) AND state = 'pending'"
                ) == 10,
                "an enabled hook's deliveries are left alone"
            )
            let replayed = try await db.queue.operations.replayWebhookDeliveries(ids: [], hook: hook)
            #expect(replayed.replayed.count == 10)
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.webhook_deliveries WHERE webhook_id = \(hook) AND state = 'pending'"
                ) == 10
            )
        }
    }
}
