import Foundation
import PostgresNIO
import PushProcess
import PushQueue
import PushQueueTesting
import Testing

/// The producer contract as a property: any row a producer can write either is refused at the INSERT with
/// an error that names the rule, or is driven by a real worker to `delivered` or to a dead letter with a
/// sentence. Never a stuck queue, a stuck job, a crashed worker, or a failed batch of innocent jobs.
///
/// Seeded: the seed is printed; `PUSH_PROPERTY_SEED=N` replays one, `PUSH_PROPERTY_ROWS=N` (default 1,500)
/// sets how many rows are tried (the long mode: 20000).
@Suite("The producer contract, property-tested with random rows")
struct ProducerPropertyTests {
    /// SplitMix64: small, seedable, the same sequence on every platform.
    struct Generator: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            self.state &+= 0x9E37_79B9_7F4A_7C15
            var z = self.state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    /// One generated row: SQL literals per column (nil: the column is left out), and whether every value
    /// is one a careful producer would write (such a row must be delivered).
    struct Row: Sendable {
        var columns: [(name: String, literal: String)] = []
        var careful = true
        var idempotent = false

        var sql: String {
            let names = self.columns.map(\.name).joined(separator: ", ")
            let values = self.columns.map(\.literal).joined(separator: ", ")
            return "INSERT INTO push.jobs (\(names)) VALUES (\(values))"
                + (self.idempotent ? " ON CONFLICT (apns_id) DO NOTHING" : "") + " RETURNING id"
        }
    }

    static func quote(_ text: String) -> String { "'" + text.replacingOccurrences(of: "'", with: "''") + "'" }

    static func randomText(_ g: inout Generator, maxLength: Int) -> String {
        let alphabet: [Unicode.Scalar] =
            Array("abcXYZ019.-_ /:\"\\{}".unicodeScalars) + [
                "\u{1}", "\u{7}", "\t", "\n", "\r", "\u{7f}", "é", "🙂", "\u{202e}", "ß", "\u{a0}",
            ]
        let length = Int.random(in: 0...maxLength, using: &g)
        var text = ""
        for _ in 0..<length { text.unicodeScalars.append(alphabet.randomElement(using: &g)!) }
        return text
    }

    static func hex(_ g: inout Generator, bytes: Int) -> String {
        (0..<bytes).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &g)) }.joined()
    }

    /// A row: each column careful most of the time, hostile otherwise.
    static func row(_ g: inout Generator, sharedAPNsIDs: [String]) -> Row {
        var row = Row()
        func pick<T>(_ careful: [T], _ hostile: [T], hostileShare: Double = 0.06) -> (T, Bool) {
            if Double.random(in: 0..<1, using: &g) < hostileShare {
                return (hostile.randomElement(using: &g)!, false)
            }
            return (careful.randomElement(using: &g)!, true)
        }
        func add(_ name: String, _ choice: (String?, Bool)) {
            if let literal = choice.0 { row.columns.append((name, literal)) }
            if !choice.1 { row.careful = false }
        }
        let text = Self.randomText(&g, maxLength: 40)
        add(
            "topic",
            pick(
                ["'com.example.app'"],
                [
                    "''", quote(text), "repeat('a', 300)", "'com.example.app.voip'", "'com.example.app' || chr(10)",
                    "NULL",
                ]
            )
        )
        let isChannel = Double.random(in: 0..<1, using: &g) < 0.05
        if isChannel {
            add("channel_id", pick(["'dGVzdC1jaGFubmVs'"], [quote(text), "repeat('A', 200)", "''"]))
            add("push_type", ("'liveactivity'", true))
            // Broadcasts need a registered channel; the simulator knows none: dead with APNs' reason.
            row.careful = false
        } else {
            add(
                "device_token",
                pick(
                    [quote(Self.hex(&g, bytes: 32))],
                    [
                        quote(Self.hex(&g, bytes: 4)), quote(Self.hex(&g, bytes: 32) + "a"), quote(text),
                        "repeat('ab', 5000)", "NULL", quote(Self.hex(&g, bytes: 100)),
                    ]
                )
            )
            if Double.random(in: 0..<1, using: &g) < 0.03 { add("channel_id", ("'dGVzdA=='", false)) }
            add(
                "push_type",
                pick(
                    [nil, "'alert'", "'background'"],
                    ["'banner'", quote(text), "'voip'", "'liveactivity'", "'complication'", "NULL"]
                )
            )
        }
        let bodyLength = Int.random(in: 0...300, using: &g)
        let body = String(repeating: "x", count: bodyLength)
        add(
            "payload",
            pick(
                [
                    quote("{\"aps\":{\"alert\":\"\(body)\"}}"),
                    quote(
                        "{\"aps\" : { \"alert\" : { \"title\" : \"é🙂\", \"body\" : \"a: b, c\" } }, \"k\" : [1, 2.5, null] }"
                    ),
                    quote("{\"aps\":{\"content-available\":1}}"),
                ],
                [
                    "'[1,2]'", "'{}'", quote("{\"aps\":{\"alert\":\"\(String(repeating: "y", count: 4_500))\"}}"),
                    "jsonb_build_object('aps', '{}'::jsonb, 'pad', repeat('z', 20000))", quote("{\"aps\":"),
                    quote("{\"aps\":{\"alert\":\"\\u0000\"}}"), "NULL",
                    quote("{\"aps\":{\"alert\":\(text.debugDescription)}}"),
                ]
            )
        )
        add("priority", pick([nil, "NULL", "5"], ["10", "1", "7", "32767", "-1"]))
        add("environment", pick([nil, "'production'", "'development'"], ["'sandbox'", quote(text), "NULL"]))
        add(
            "credential",
            pick([nil, "'default'"], ["'other'", quote(text), "repeat('c', 70)", "''"], hostileShare: 0.03)
        )
        add(
            "collapse_id",
            pick([nil, "NULL", "'order-42'"], [quote(text), "repeat('x', 65)", "'a' || chr(13) || chr(10) || 'b'"])
        )
        add(
            "expires_at",
            pick(
                [nil, "NULL", "now() + interval '1 hour'"],
                ["now() - interval '1 minute'", "'infinity'", "'-infinity'", "'294276-01-01'", "'not a time'"]
            )
        )
        add("run_at", pick([nil, "now()", "now() - interval '1 day'"], ["'infinity'", "'-infinity'", "NULL"]))
        if Double.random(in: 0..<1, using: &g) < 0.1 {
            add("apns_id", (quote(sharedAPNsIDs.randomElement(using: &g)!), true))
            row.idempotent = Double.random(in: 0..<1, using: &g) < 0.7
        }
        add("max_attempts", pick([nil, "NULL", "3"], ["0", "-5", "32767"]))
        // The worker's columns: a careful producer never writes them; the schema must make them harmless.
        if Double.random(in: 0..<1, using: &g) < 0.1 {
            let forged: [(String, String)] = [
                ("state", "'running'"), ("state", "'delivered'"), ("attempts", "32767"),
                ("trap_ids", "ARRAY[NULL]::text[]"),
                ("locked_by", "'nobody'"), ("history", "'[{\"forged\":1}]'"), ("transport_retries", "32767"),
                ("created_at", "'2000-01-01'"), ("id", "987654321"), ("status", "200"),
            ]
            let (name, literal) = forged.randomElement(using: &g)!
            if !row.columns.contains(where: { $0.name == name }) {
                row.columns.append((name, literal))
                if name == "id" { row.careful = false }
            }
        }
        return row
    }

    @Test("random rows: refused with a named rule, or delivered, or dead with a sentence; the worker never stops")
    func randomRows() async throws {
        let environment = ProcessInfo.processInfo.environment
        let seed = environment["PUSH_PROPERTY_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 0...UInt64.max)
        let total = environment["PUSH_PROPERTY_ROWS"].flatMap(Int.init) ?? 1_500
        print("producer property: seed \(seed) (PUSH_PROPERTY_SEED=\(seed) replays it), \(total) rows")
        var g = Generator(state: seed)
        let shared = (0..<5).map { _ in UUID().uuidString }
        let rows = (0..<total).map { _ in Self.row(&g, sharedAPNsIDs: shared) }
        let knownRules: Set<String> = [
            "topic_must_be_a_non_empty_bundle_id", "topic_must_be_a_bundle_id_up_to_255_bytes",
            "exactly_one_of_device_token_channel_id_recipient_or_activity_id", "device_token_must_not_be_empty",
            "channel_id_must_not_be_empty", "payload_must_be_a_json_object", "push_type_must_be_a_known_apns_push_type",
            "priority_must_be_10_5_or_1", "background_push_priority_must_be_5_or_1",
            "environment_must_be_production_or_development", "credential_must_not_be_empty",
            "collapse_id_must_be_at_most_64_bytes", "max_attempts_must_be_at_least_1",
            "state_must_be_pending_running_or_delivered", "payload_must_be_at_most_16384_bytes",
            "device_token_must_be_hex_of_16_to_200_bytes", "channel_id_must_be_base64_up_to_128_characters",
            "collapse_id_must_not_contain_control_characters",
            "credential_must_be_up_to_64_bytes_without_control_characters",
            "run_at_must_be_finite", "expires_at_must_be_finite", "jobs_apns_id_key",
        ]
        try await DaemonFixture.run { f in
            // A worker runs while rows arrive, as in production.
            let worker = try f.startWorker("p", ["--credential-wait", "2s", "--concurrency", "200"])
            var refused: [String: Int] = [:]
            var inserted: [Int64] = []
            var careful: [Int64] = []
            var skipped = 0
            // One producer session for all the rows, as a producer's own connection would be: 1,500 short
            // statements through the pool made it open a connection each time a release had not yet landed.
            try await f.db.client.withConnection { connection in
                for (index, row) in rows.enumerated() {
                    f.phase("inserting row \(index + 1) of \(rows.count): \(row.sql.prefix(300))")
                    do {
                        let ids = try await withDeadline(TestDatabase.clientDeadline, "INSERT \(index + 1)") {
                            try await connection.query(PostgresQuery(unsafeSQL: row.sql), logger: f.db.logger)
                                .collect().map { try $0.decode(Int64.self) }
                        }
                        if ids.isEmpty { skipped += 1 }
                        inserted += ids
                        if row.careful { careful += ids }
                    } catch let error as PSQLError {
                        let state = error.serverInfo?[.sqlState] ?? "?"
                        let constraint = error.serverInfo?[.constraintName]
                        let message = error.serverInfo?[.message] ?? ""
                        let key: String
                        switch state {
                        case "23514", "23505":
                            key = constraint ?? "?"
                            #expect(
                                knownRules.contains(key),
                                "a refusal names its rule: \(key) for \(row.sql.prefix(300))"
                            )
                        case "23502": key = "not null: \(error.serverInfo?[.columnName] ?? "?")"
                        case "428C9": key = "id is generated always"
                        case "22P02", "22007", "22008", "22021", "22P05", "22003":
                            key = "invalid input (\(state))"
                        default:
                            key = "unexpected \(state)"
                            Issue.record(
                                "an INSERT failed without naming a rule: \(state) \(message) for \(row.sql.prefix(300))"
                            )
                        }
                        refused[key, default: 0] += 1
                    }
                }
            }
            #expect(kill(worker.pid, 0) == 0, "the worker is still running: \(worker.output.suffix(2000))")
            try await f.waitUntil(.seconds(180), "every inserted row terminal") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state <> 'delivered'") == 0
            }
            #expect(kill(worker.pid, 0) == 0, "the worker never stopped: \(worker.output.suffix(2000))")
            f.phase("stopping the worker")
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0, "\(worker.output.suffix(2000))")

            f.phase("checking the outcomes and the invariants")
            let ids = "{\(inserted.map(String.init).joined(separator: ","))}"
            let delivered = try await f.db.int64(
                "SELECT count(*) FROM push.jobs WHERE state = 'delivered' AND id = ANY ('\(unescaped: ids)'::bigint[])"
            )
            let dead = try await f.db.int64(
                "SELECT count(*) FROM push.dead_jobs WHERE id = ANY ('\(unescaped: ids)'::bigint[])"
            )
            #expect(delivered + dead == Int64(inserted.count), "every inserted row delivered or dead")
            // Hostile rows die before a request (pre-send rejections): a sentence, no APNs status.
            try await FaultTests.assertInvariants(
                f,
                jobs: inserted.count,
                diedWorkers: [],
                rejectedBeforeSend: true,
                seed: seed
            )
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.dead_jobs WHERE error = '' OR reason = ''") == 0,
                "every dead letter has a reason and a sentence"
            )
            let carefulIDs = "{\(careful.map(String.init).joined(separator: ","))}"
            let carefulDelivered = try await f.db.int64(
                "SELECT count(*) FROM push.jobs WHERE state = 'delivered' AND id = ANY ('\(unescaped: carefulIDs)'::bigint[])"
            )
            let carefulDead = try await f.db.client.query(
                "SELECT id, reason, error FROM push.dead_jobs WHERE id = ANY (\(careful)::bigint[]) LIMIT 5"
            ).decode((Int64, String, String).self).collect()
            #expect(
                carefulDelivered == Int64(careful.count),
                "a careful row is never harmed by a hostile neighbour: \(carefulDead)"
            )
            var reasons: [String: Int] = [:]
            for try await (reason, n) in try await f.db.client.query(
                "SELECT reason, count(*)::bigint FROM push.dead_jobs GROUP BY reason ORDER BY 2 DESC"
            ).decode((String, Int64).self) {
                reasons[reason] = Int(n)
            }
            print(
                """
                producer property (seed \(seed)): \(total) rows tried: \(refused.values.reduce(0, +)) refused at INSERT, \
                \(skipped) skipped as already spent (apns_id), \(inserted.count) inserted (\(careful.count) careful): \
                \(delivered) delivered, \(dead) dead
                  refused by: \(refused.sorted { $0.value > $1.value }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
                  dead by reason: \(reasons.sorted { $0.value > $1.value }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
                """
            )
        }
    }
}
