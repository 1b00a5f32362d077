import Foundation
import PostgresNIO
import PushQueue
import PushQueueTesting
import Testing

@Suite("Producers: the SQL contract")
struct ProducerTests {
    @Test("the contract's INSERT works with defaults")
    func defaults() async throws {
        try await TestPostgres.withDatabase { db in
            let id = try await db.int64(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                VALUES ('com.example.app', '7f3c', '{"aps":{"alert":{"title":"Order shipped","body":"Arrives Tuesday"}}}')
                RETURNING id
                """
            )
            let record = try #require(try await db.queue.job(id: id))
            #expect(record.state == .pending)
            #expect(record.job.pushType == "alert")
            #expect(record.job.environment == "production")
            #expect(record.job.credential == "default")
            #expect(record.job.priority == nil)
            #expect(record.job.attempts == 0)
            #expect(record.rowJSON.contains("\"apns_id\""))
        }
    }

    @Test("idempotent enqueue: ON CONFLICT (apns_id) DO NOTHING inserts once")
    func idempotentEnqueue() async throws {
        try await TestPostgres.withDatabase { db in
            let apnsID = UUID().uuidString
            for _ in 0..<3 {
                try await db.execute(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload, apns_id)
                    VALUES ('com.example.app', 'ab', '{"aps":{}}', '\(apnsID)')
                    ON CONFLICT (apns_id) DO NOTHING
                    """
                )
            }
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE apns_id = '\(unescaped: apnsID)'") == 1)
        }
    }

    static let badInserts: [(values: String, rule: String)] = [
        (
            "('com.example.app', 'ab', NULL, '{}', 'banner', NULL, 'production', NULL)",
            "push_type_must_be_a_known_apns_push_type"
        ),
        (
            "('com.example.app', 'ab', 'Y2hhbm5lbA==', '{}', 'alert', NULL, 'production', NULL)",
            "exactly_one_of_device_token_or_channel_id"
        ),
        (
            "('com.example.app', NULL, NULL, '{}', 'alert', NULL, 'production', NULL)",
            "exactly_one_of_device_token_or_channel_id"
        ),
        ("('com.example.app', 'ab', NULL, '{}', 'alert', 7, 'production', NULL)", "priority_must_be_10_5_or_1"),
        (
            "('com.example.app', 'ab', NULL, '{}', 'alert', NULL, 'production', repeat('x', 65))",
            "collapse_id_must_be_at_most_64_bytes"
        ),
        (
            "('com.example.app', 'ab', NULL, '{}', 'alert', NULL, 'production', repeat('é', 33))",
            "collapse_id_must_be_at_most_64_bytes"
        ),
        (
            "('com.example.app', 'ab', NULL, '{}', 'alert', NULL, 'sandbox', NULL)",
            "environment_must_be_production_or_development"
        ),
        (
            "('com.example.app', 'ab', NULL, '{}', 'background', 10, 'production', NULL)",
            "background_push_priority_must_be_5_or_1"
        ),
        (
            "('com.example.app', 'ab', NULL, '[1,2]', 'alert', NULL, 'production', NULL)",
            "payload_must_be_a_json_object"
        ),
        ("('', 'ab', NULL, '{}', 'alert', NULL, 'production', NULL)", "topic_must_be_a_non_empty_bundle_id"),
    ]

    @Test("bad input is refused at the INSERT by a constraint that names the rule", arguments: badInserts)
    func refusedAtInsert(values: String, rule: String) async throws {
        try await TestPostgres.withDatabase { db in
            let error = await #expect(throws: PSQLError.self) {
                try await db.execute(
                    """
                    INSERT INTO push.jobs (topic, device_token, channel_id, payload, push_type, priority, environment, collapse_id)
                    VALUES \(values)
                    """
                )
            }
            #expect(error?.serverInfo?[.constraintName] == rule)
            #expect(error?.serverInfo?[.sqlState] == "23514")
            let rows = try await db.int64("SELECT count(*) FROM push.jobs")
            #expect(rows == 0)
        }
    }
}
