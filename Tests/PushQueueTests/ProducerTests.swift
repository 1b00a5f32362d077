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
                VALUES ('com.example.app', repeat('7f3c', 64 / length('7f3c')), '{"aps":{"alert":{"title":"Order shipped","body":"Arrives Tuesday"}}}')
                RETURNING id
                """
            )
            let record = try #require(try await db.queue.operations.job(id: id))
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
                    VALUES ('com.example.app', repeat('ab', 64 / length('ab')), '{"aps":{}}', '\(apnsID)')
                    ON CONFLICT (apns_id) DO NOTHING
                    """
                )
            }
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE apns_id = '\(unescaped: apnsID)'") == 1)
        }
    }

    static let badInserts: [(values: String, rule: String)] = [
        (
            "('com.example.app', repeat('ab', 64 / length('ab')), NULL, '{}', 'banner', NULL, 'production', NULL)",
            "push_type_must_be_a_known_apns_push_type"
        ),
        (
            "('com.example.app', repeat('ab', 64 / length('ab')), 'Y2hhbm5lbA==', '{}', 'alert', NULL, 'production', NULL)",
            "exactly_one_of_device_token_channel_id_recipient_or_activity_id"
        ),
        (
            "('com.example.app', NULL, NULL, '{}', 'alert', NULL, 'production', NULL)",
            "exactly_one_of_device_token_channel_id_recipient_or_activity_id"
        ),
        (
            "('com.example.app', repeat('ab', 64 / length('ab')), NULL, '{}', 'alert', 7, 'production', NULL)",
            "priority_must_be_10_5_or_1"
        ),
        (
            "('com.example.app', repeat('ab', 64 / length('ab')), NULL, '{}', 'alert', NULL, 'production', repeat('x', 65))",
            "collapse_id_must_be_at_most_64_bytes"
        ),
        (
            "('com.example.app', repeat('ab', 64 / length('ab')), NULL, '{}', 'alert', NULL, 'production', repeat('é', 33))",
            "collapse_id_must_be_at_most_64_bytes"
        ),
        (
            "('com.example.app', repeat('ab', 64 / length('ab')), NULL, '{}', 'alert', NULL, 'sandbox', NULL)",
            "environment_must_be_production_or_development"
        ),
        (
            "('com.example.app', repeat('ab', 64 / length('ab')), NULL, '{}', 'background', 10, 'production', NULL)",
            "background_push_priority_must_be_5_or_1"
        ),
        (
            "('com.example.app', repeat('ab', 64 / length('ab')), NULL, '[1,2]', 'alert', NULL, 'production', NULL)",
            "payload_must_be_a_json_object"
        ),
        (
            "('', repeat('ab', 32), NULL, '{}', 'alert', NULL, 'production', NULL)",
            "topic_must_be_a_bundle_id_up_to_255_bytes"
        ),
        // Schema version 4: sizes, formats, control characters, finite times.
        (
            "('com.example.app', 'ab', NULL, '{}', 'alert', NULL, 'production', NULL)",
            "device_token_must_be_hex_of_16_to_200_bytes"
        ),
        (
            "('com.example.app', repeat('ab', 201), NULL, '{}', 'alert', NULL, 'production', NULL)",
            "device_token_must_be_hex_of_16_to_200_bytes"
        ),
        (
            "('com.example.app', repeat('zz', 32), NULL, '{}', 'alert', NULL, 'production', NULL)",
            "device_token_must_be_hex_of_16_to_200_bytes"
        ),
        (
            "('com.example.app', repeat('a', 63), NULL, '{}', 'alert', NULL, 'production', NULL)",
            "device_token_must_be_hex_of_16_to_200_bytes"
        ),
        (
            "('com.example.app', repeat('ab', 32), NULL, jsonb_build_object('aps', '{}'::jsonb, 'pad', repeat('x', 20000)), 'alert', NULL, 'production', NULL)",
            "payload_must_be_at_most_16384_bytes"
        ),
        (
            "('com.example' || chr(10) || 'app', repeat('ab', 32), NULL, '{}', 'alert', NULL, 'production', NULL)",
            "topic_must_be_a_bundle_id_up_to_255_bytes"
        ),
        (
            "('com.example.app/x', repeat('ab', 32), NULL, '{}', 'alert', NULL, 'production', NULL)",
            "topic_must_be_a_bundle_id_up_to_255_bytes"
        ),
        (
            "(repeat('a', 256), repeat('ab', 32), NULL, '{}', 'alert', NULL, 'production', NULL)",
            "topic_must_be_a_bundle_id_up_to_255_bytes"
        ),
        (
            "('com.example.app', NULL, 'Y2hh bm5l', '{}', 'liveactivity', NULL, 'production', NULL)",
            "channel_id_must_be_base64_up_to_128_characters"
        ),
        (
            "('com.example.app', NULL, repeat('A', 129), '{}', 'liveactivity', NULL, 'production', NULL)",
            "channel_id_must_be_base64_up_to_128_characters"
        ),
        (
            "('com.example.app', repeat('ab', 32), NULL, '{}', 'alert', NULL, 'production', 'a' || chr(13) || chr(10) || 'b')",
            "collapse_id_must_not_contain_control_characters"
        ),
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
