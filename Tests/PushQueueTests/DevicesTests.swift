import Foundation
import PostgresNIO
import PushCore
import PushQueueTesting
import Testing

@testable import PushQueue

/// The device registry (schema 17, CONTRACT 1d): producers upsert tokens, the worker's token-invalid answers
/// mark them, the next upsert clears the mark; constraints name their rules; a producer role sees its own rows.
@Suite("The device registry: push.devices kept true by producers' upserts and the worker's answers")
struct DevicesTests {
    static let token = String(repeating: "ab", count: 32)
    static let other = String(repeating: "cd", count: 32)

    /// The producer's upsert, as docs/operations.md gives it.
    static func upsert(
        _ db: TestDatabase,
        recipient: String,
        token: String = Self.token,
        environment: String = "production",
        platform: String = "apns",
        topic: String = "com.example.app"
    ) async throws {
        try await db.execute(
            """
            INSERT INTO push.devices (recipient, platform, topic, token, environment)
            VALUES ('\(recipient)', '\(platform)', '\(topic)', '\(token)', '\(environment)')
            ON CONFLICT (platform, topic, token) DO UPDATE
               SET recipient = excluded.recipient, kind = excluded.kind, activity_id = excluded.activity_id,
                   environment = excluded.environment
            """
        )
    }

    /// A token-invalid answer as the outcome write records it (push.invalid_tokens), at `at`.
    static func invalid(
        _ db: TestDatabase,
        token: String = Self.token,
        environment: String = "production",
        reason: String = "Unregistered",
        at: String = "now()"
    ) async throws {
        try await db.execute(
            """
            INSERT INTO push.invalid_tokens (device_token, topic, environment, reason, invalidated_at, job_id)
            VALUES ('\(token)', 'com.example.app', '\(environment)', '\(reason)', \(at), 1)
            ON CONFLICT (device_token, topic, environment) DO UPDATE
               SET reason = excluded.reason, invalidated_at = excluded.invalidated_at
            """
        )
    }

    static func state(_ db: TestDatabase, _ token: String = Self.token) async throws -> (String, String?) {
        let rows = try await db.client.query(
            "SELECT recipient, invalidated_reason FROM push.devices WHERE token = \(token)"
        ).decode((String, String?).self)
        for try await row in rows { return row }
        throw QueueError(code: .invalidArgument, message: "no device \(token)")
    }

    static let refused: [(String, String)] = [
        (
            "INSERT INTO push.devices (recipient, topic, token) VALUES ('user:1', 'com.example.app', 'not-hex')",
            "device_apns_token_must_be_hex_of_16_to_200_bytes"
        ),
        (
            "INSERT INTO push.devices (recipient, platform, topic, token, environment) VALUES ('user:1', 'fcm', 'com.example.app', 'a:1', 'auto')",
            "device_environment_must_be_production_development_or_auto"
        ),
        (
            "INSERT INTO push.devices (recipient, topic, token, kind) VALUES ('user:1', 'com.example.app', '\(token)', 'activity')",
            "device_activity_tokens_name_their_activity"
        ),
        (
            "INSERT INTO push.devices (recipient, platform, topic, token, kind, environment) VALUES ('user:1', 'fcm', 'com.example.app', 'a:1', 'push_to_start', 'fcm')",
            "device_live_activity_tokens_are_apns_only"
        ),
        (
            "INSERT INTO push.devices (recipient, topic, token) VALUES ('', 'com.example.app', '\(token)')",
            "device_recipient_must_be_1_to_255_bytes_no_control_characters"
        ),
        (
            "INSERT INTO push.devices (recipient, topic, token, kind) VALUES ('user:1', 'com.example.app', '\(token)', 'phone')",
            "device_kind_must_be_device_push_to_start_or_activity"
        ),
        (
            "INSERT INTO push.devices (recipient, topic, token) VALUES ('user:1', 'com example', '\(token)')",
            "device_topic_must_be_a_bundle_id_or_package_name"
        ),
    ]

    @Test("a bad row is refused by a constraint that names the rule", arguments: refused)
    func refusedByName(sql: String, rule: String) async throws {
        try await TestPostgres.withDatabase { db in
            let error = await #expect(throws: PSQLError.self) { try await db.execute(sql) }
            #expect(error?.serverInfo?[.constraintName] == rule)
            let rows = try await db.int64("SELECT count(*) FROM push.devices")
            #expect(rows == 0)
        }
    }

    @Test("the upsert moves a token to its newest recipient; operators see fingerprints and counts, never the token")
    func latestRecipientWins() async throws {
        try await TestPostgres.withDatabase { db in
            try await Self.upsert(db, recipient: "user:1")
            try await Self.upsert(db, recipient: "user:2")
            try await Self.upsert(db, recipient: "user:2", token: Self.other)
            #expect(try await db.int64("SELECT count(*) FROM push.devices") == 2)
            #expect(try await Self.state(db).0 == "user:2", "the token moved to its newest recipient")
            let devices = try await db.queue.operations.devices(recipient: "user:2")
            #expect(devices.count == 2 && devices.allSatisfy(\.isLive))
            #expect(
                Set(devices.map(\.tokenFingerprint)) == [tokenFingerprint(Self.token), tokenFingerprint(Self.other)]
            )
            let shown = String(decoding: try JSONEncoder().encode(devices), as: UTF8.self)
            #expect(!shown.contains(Self.token) && !shown.contains(Self.other), "no token leaves the queue")
            #expect(try await db.queue.operations.devices(recipient: "user:1").isEmpty)
            let counts = try await db.queue.operations.deviceCounts()
            #expect(counts.devices == 2 && counts.live == 2 && counts.recipientsReachable == 1)
        }
    }

    @Test(
        "a token-invalid answer marks the device of its token, topic and environment; one given before the app registered again, one for the other environment and BadDeviceToken for an auto device do not; the next upsert clears the mark"
    )
    func invalidation() async throws {
        try await TestPostgres.withDatabase { db in
            try await Self.upsert(db, recipient: "user:1")
            try await Self.upsert(db, recipient: "user:2", token: Self.other, environment: "auto")
            // The other environment's answer, and a 410 from before the app's registration: no mark.
            try await Self.invalid(db, environment: "development")
            try await Self.invalid(db, reason: "Unregistered", at: "now() - interval '1 hour'")
            #expect(try await Self.state(db).1 == nil)
            // An auto device's BadDeviceToken in production says only that the token is development's.
            try await Self.invalid(db, token: Self.other, reason: "BadDeviceToken")
            #expect(try await Self.state(db, Self.other).1 == nil)
            // A 410 after the registration marks it; so does any other answer for an auto device.
            try await Self.invalid(db, reason: "Unregistered", at: "now() + interval '1 second'")
            #expect(try await Self.state(db).1 == "Unregistered")
            try await Self.invalid(db, token: Self.other, reason: "Unregistered")
            #expect(try await Self.state(db, Self.other).1 == "Unregistered")
            let counts = try await db.queue.operations.deviceCounts()
            #expect(counts.live == 0 && counts.recipientsReachable == 0)
            // The app registered again: the upsert clears the mark.
            try await Self.upsert(db, recipient: "user:1")
            #expect(try await Self.state(db).1 == nil)
        }
    }

    @Test("the worker's own outcome write marks the device: FCM UNREGISTERED through writeOutcomes")
    func invalidationThroughTheOutcomeWrite() async throws {
        try await TestPostgres.withDatabase { db in
            try await Self.upsert(db, recipient: "user:7", token: "fcm-token:1", environment: "fcm", platform: "fcm")
            let ids = try await db.int64s(
                "INSERT INTO push.jobs (platform, topic, device_token, payload) VALUES ('fcm', 'com.example.app', 'fcm-token:1', '{}') RETURNING id"
            )
            let claimed = try await db.queue.claim(limit: 1, workerID: "w", lease: .seconds(60))
            #expect(claimed.map(\.id) == ids)
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
                    )
                ],
                workerID: "w"
            )
            let device = try #require(try await db.queue.operations.devices(recipient: "user:7").first)
            #expect(!device.isLive && device.invalidatedReason == "UNREGISTERED")
        }
    }

    @Test("the operator's guide's producer role upserts its own devices and sees no other role's")
    func producerRoleSeesItsOwnRows() async throws {
        let guide = try String(
            contentsOfFile: URL(fileURLWithPath: #filePath).deletingLastPathComponent()
                .appendingPathComponent("../../docs/operations.md").path,
            encoding: .utf8
        )
        let recipe = try #require(
            guide.components(separatedBy: "CREATE ROLE app_producer").dropFirst().first?.components(separatedBy: "```")
                .first
        )
        try await TestPostgres.withDatabase(maxConnections: 1) { db in
            // Another team's device, registered by the owner.
            try await Self.upsert(db, recipient: "user:9", token: Self.other)
            let role = "app_producer_\(UInt32.random(in: 0...UInt32.max))"
            let statements = ("CREATE ROLE app_producer" + recipe).replacingOccurrences(of: "app_producer", with: role)
                .replacingOccurrences(of: "PASSWORD '…'", with: "")
            for statement in SQLScript.statements(in: statements) { try await db.execute(statement) }
            try await db.execute("SET ROLE \(role)")
            try await Self.upsert(db, recipient: "user:1")
            try await Self.upsert(db, recipient: "user:1")
            #expect(try await db.int64("SELECT count(*) FROM push.devices") == 1, "its own row only")
            // The other registrar's token is not its to move.
            let refused = await #expect(throws: PSQLError.self) {
                try await Self.upsert(db, recipient: "user:1", token: Self.other)
            }
            #expect(refused?.serverInfo?[.sqlState] == "42501")
            await #expect(throws: PSQLError.self) {
                try await db.execute("UPDATE push.devices SET invalidated_at = now()")
            }
            try await db.execute("RESET ROLE")
            #expect(try await Self.state(db, Self.other).0 == "user:9")
            try await db.execute("DROP OWNED BY \(role)")
            try await db.execute("DROP ROLE \(role)")
        }
    }
}

extension DevicesTests {
    @Test(
        "a producer holding an open upsert of a device stops no outcome write: the worker's 410 for that token is written without waiting (pg_stat_activity), the device is left to the upsert, which leaves it live"
    )
    func openUpsertHoldsNoOutcome() async throws {
        try await TestPostgres.withDatabase { db in
            try await Self.upsert(db, recipient: "user:1")
            let ids = try await db.int64s(
                "INSERT INTO push.jobs (topic, device_token, payload) VALUES ('com.example.app', '\(unescaped: Self.token)', '{\"aps\":{}}') RETURNING id"
            )
            let claimed = try await db.queue.claim(limit: 1, workerID: "w", lease: .seconds(60))
            #expect(claimed.map(\.id) == ids)
            // The app registers again, in a producer transaction left open: it holds the device's row.
            let producer = try await FleetInterleavingTests.session(db)
            defer { Task { try? await producer.close() } }
            try await producer.query("BEGIN", logger: db.logger)
            try await producer.query(
                """
                INSERT INTO push.devices (recipient, topic, token) VALUES ('user:1', 'com.example.app', \(Self.token))
                ON CONFLICT (platform, topic, token) DO UPDATE SET recipient = excluded.recipient
                """,
                logger: db.logger
            )
            let release: @Sendable () async throws -> Void = {
                _ = try await producer.query("COMMIT", logger: db.logger)
            }
            let outcome = JobOutcome(
                jobID: ids[0],
                attempt: 1,
                disposition: .dead(sentence: "APNs says the device token is no longer active for the topic"),
                attemptedAt: .now,
                status: 410,
                reason: "Unregistered",
                trapIDs: [.tokenUnregistered],
                invalidatesToken: true,
                apnsTimestampMs: Int64(Date().timeIntervalSince1970 * 1000) + 60_000
            )
            let written = try await FleetInterleavingTests.watch(db, release: release) {
                try await db.queue.writeOutcomes([outcome], workerID: "w").recorded.count
            }
            #expect(written.value == 1 && !written.waited, "the outcome write waited for the producer's upsert")
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.invalid_tokens WHERE device_token = '\(unescaped: Self.token)'"
                ) == 1,
                "the feed has the token"
            )
            try await release()
            #expect(try await Self.state(db).1 == nil, "the app's registration in flight leaves it live")
        }
    }

    @Test("the invalidation function runs for push.invalid_tokens only, and no other role may attach it")
    func invalidationFunctionIsNotAToolForOthers() async throws {
        try await TestPostgres.withDatabase(maxConnections: 1) { db in
            let misuse = await #expect(throws: PSQLError.self) {
                try await db.execute(
                    """
                    CREATE TEMP TABLE fake (device_token text, topic text, environment text, reason text, invalidated_at timestamptz);
                    """
                )
                try await db.execute(
                    "CREATE TRIGGER x AFTER INSERT ON fake FOR EACH ROW EXECUTE FUNCTION push.device_invalidated()"
                )
                try await db.execute(
                    "INSERT INTO fake VALUES ('\(Self.token)', 'com.example.app', 'production', 'Unregistered', now())"
                )
            }
            #expect(misuse?.serverInfo?[.message]?.contains("push.invalid_tokens only") == true)
            let publicGrants = try await db.int64(
                "SELECT count(*) FROM information_schema.routine_privileges WHERE routine_schema = 'push' AND routine_name = 'device_invalidated' AND grantee = 'PUBLIC'"
            )
            #expect(publicGrants == 0, "PUBLIC may not execute it")
        }
    }
}
