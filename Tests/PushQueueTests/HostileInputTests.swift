import Foundation
import PostgresNIO
import PushCore
import PushQueueTesting
import Testing

@testable import PushQueue

/// Producers are other teams' services writing SQL: each case here is a row or a habit that broke the
/// queue before schema version 4, checked at the level where it happens.
@Suite("Hostile producers: the schema defends itself")
struct HostileInputTests {
    static let token = String(repeating: "ab", count: 32)

    /// Statements a producer might send, and the constraint that must refuse each.
    static let refused: [(sql: String, rule: String)] = [
        (
            "INSERT INTO push.jobs (topic, device_token, payload, credential) VALUES ('com.example.app', '\(token)', '{}', 'team' || chr(1) || 'b')",
            "credential_must_be_up_to_64_bytes_without_control_characters"
        ),
        (
            "INSERT INTO push.jobs (topic, device_token, payload, credential) VALUES ('com.example.app', '\(token)', '{}', repeat('c', 65))",
            "credential_must_be_up_to_64_bytes_without_control_characters"
        ),
        (
            "INSERT INTO push.jobs (topic, device_token, payload, run_at) VALUES ('com.example.app', '\(token)', '{}', 'infinity')",
            "run_at_must_be_finite"
        ),
        (
            "INSERT INTO push.jobs (topic, device_token, payload, run_at) VALUES ('com.example.app', '\(token)', '{}', '-infinity')",
            "run_at_must_be_finite"
        ),
        (
            "INSERT INTO push.jobs (topic, device_token, payload, expires_at) VALUES ('com.example.app', '\(token)', '{}', 'infinity')",
            "expires_at_must_be_finite"
        ),
    ]

    @Test("sizes, formats and infinities are refused by a constraint that names the rule", arguments: refused)
    func refusedByName(sql: String, rule: String) async throws {
        try await TestPostgres.withDatabase { db in
            let error = await #expect(throws: PSQLError.self) { try await db.execute(sql) }
            #expect(error?.serverInfo?[.constraintName] == rule)
            let rows = try await db.int64("SELECT count(*) FROM push.jobs")
            #expect(rows == 0)
        }
    }

    @Test(
        "the cheaper token and topic rules (schema 7) accept exactly what the regular expressions did: 4,000 generated strings"
    )
    func cheaperRulesMatchTheRegexes() async throws {
        var random = SystemRandomNumberGenerator()
        let seed = UInt64.random(in: 1...999_999, using: &random)
        print("rule equivalence seed \(seed)")
        var generator = SeededRandom(seed: seed)
        // Near the edges: hex of every length around 32 and 400, odd lengths, one foreign character (ASCII,
        // a space, a non-ASCII letter), dots and hyphens first, empty strings.
        let alphabets = ["0123456789abcdef", "0123456789ABCDEFabcdefg ", "abcXYZ019.-", "a.b-c_d é/"]
        var samples: [String] = []
        for _ in 0..<4_000 {
            let alphabet = Array(alphabets[Int(generator.next() % UInt64(alphabets.count))])
            let length =
                [0, 1, 2, 31, 32, 33, 64, 399, 400, 401, 402, 256, 255][Int(generator.next() % 13)]
                + Int(generator.next() % 3) - 1
            samples.append(
                String((0..<max(length, 0)).map { _ in alphabet[Int(generator.next() % UInt64(alphabet.count))] })
            )
        }
        let strings = samples
        try await TestPostgres.withDatabase { db in
            let mismatches = try await db.int64(
                """
                SELECT count(*) FROM unnest(\(strings)::text[]) AS s(v)
                 WHERE (v ~ '^([0-9A-Fa-f]{2}){16,200}$')
                       IS DISTINCT FROM (octet_length(v) BETWEEN 32 AND 400 AND octet_length(v) % 2 = 0
                                         AND ltrim(v, '0123456789ABCDEFabcdef') = '')
                    OR (octet_length(v) <= 255 AND v ~ '^[A-Za-z0-9][A-Za-z0-9.-]*$')
                       IS DISTINCT FROM (octet_length(v) BETWEEN 1 AND 255 AND left(v, 1) NOT IN ('.', '-')
                                         AND ltrim(v, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-') = '')
                """
            )
            #expect(mismatches == 0, "seed \(seed): \(mismatches) strings judged differently")
        }
    }

    @Test("a producer cannot set the worker's columns: they are reset at INSERT, and an explicit id is refused")
    func workerColumnsAreTheWorkers() async throws {
        try await TestPostgres.withDatabase { db in
            // Before schema version 4, attempts = 32767 stopped every claim on every worker (smallint overflow),
            // state = 'running' with no lease was never reaped, and a NULL trap id failed the decode.
            let id = try await db.int64(
                """
                INSERT INTO push.jobs (topic, device_token, payload, state, attempts, transport_retries, trap_ids,
                                       locked_by, locked_until, history, created_at, status, reason, delivered_at)
                VALUES ('com.example.app', '\(unescaped: Self.token)', '{"aps":{}}', 'running', 32767, 32767,
                        ARRAY[NULL, 'MS999'], 'nobody', NULL, '[{"forged":true}]', '2000-01-01', 200, 'x', now())
                RETURNING id
                """
            )
            let details = try #require(try await db.queue.operations.job(id: id))
            #expect(details.state == .pending && details.job.attempts == 0 && details.job.trapIDs.isEmpty)
            #expect(
                details.lockedBy == nil && details.status == nil && details.reason == nil && details.deliveredAt == nil
            )
            #expect(details.historyJSON == "[]")
            #expect(
                try await db.int64("SELECT count(*) FROM push.jobs WHERE created_at > now() - interval '1 minute'") == 1
            )
            let claimed = try await db.queue.claim(limit: 10, workerID: workerName(), lease: .seconds(30))
            #expect(claimed.map(\.id) == [id] && claimed[0].attempts == 1)

            let error = await #expect(throws: PSQLError.self) {
                try await db.execute(
                    "INSERT INTO push.jobs (id, topic, device_token, payload) VALUES (424242, 'com.example.app', '\(Self.token)', '{}')"
                )
            }
            #expect(error?.serverInfo?[.sqlState] == "428C9", "identity GENERATED ALWAYS: the id is the worker's")
        }
    }

    @Test("a row the worker cannot read is dead-lettered with a sentence; the jobs claimed with it are not harmed")
    func undecodableRow() async throws {
        try await TestPostgres.withDatabase { db in
            // Only possible behind the trigger's back (a restore, a hand edit): a NULL inside trap_ids.
            try await db.execute("ALTER TABLE push.jobs DISABLE TRIGGER jobs_before_insert")
            let poison = try await db.int64(
                "INSERT INTO push.jobs (topic, device_token, payload, trap_ids) VALUES ('com.example.app', '\(unescaped: Self.token)', '{}', ARRAY[NULL]::text[]) RETURNING id"
            )
            try await db.execute("ALTER TABLE push.jobs ENABLE TRIGGER jobs_before_insert")
            let innocent = try await enqueue(db, count: 3)
            let claimed = try await db.queue.claim(limit: 10, workerID: workerName(), lease: .seconds(30))
            #expect(Set(claimed.map(\.id)) == Set(innocent))
            let letter = try #require(try await db.queue.operations.deadLetter(id: poison))
            #expect(letter.job.id == poison && letter.reason == "InvalidJob")
            #expect(letter.error.contains("could not read this row"))
        }
    }

    @Test("an apns_id stays spent after its job is pruned or dead: an outbox retry is skipped, not sent again")
    func apnsIDAcrossTheWholeLife() async throws {
        try await TestPostgres.withDatabase { db in
            let apnsID = UUID().uuidString
            let insert = """
                INSERT INTO push.jobs (topic, device_token, payload, apns_id)
                VALUES ('com.example.app', '\(Self.token)', '{"aps":{}}', '\(apnsID)')
                ON CONFLICT (apns_id) DO NOTHING
                """
            try await db.execute(insert)
            let worker = workerName()
            let jobs = try await db.queue.claim(limit: 1, workerID: worker, lease: .seconds(30))
            _ = try await db.queue.writeOutcomes(
                [JobOutcome(jobID: jobs[0].id, attempt: 1, disposition: .delivered, attemptedAt: .now, status: 200)],
                workerID: worker
            )
            #expect(try await db.queue.pruneDelivered(olderThan: .zero) == 1)
            try await db.execute(insert)
            #expect(try await db.int64("SELECT count(*) FROM push.jobs") == 0, "pruned within memory: skipped")
            #expect(try await db.queue.forgetRetiredAPNsIDs(olderThan: .seconds(3600)) == 0)
            #expect(try await db.queue.forgetRetiredAPNsIDs(olderThan: .zero) == 1)
            try await db.execute(insert)
            #expect(try await db.int64("SELECT count(*) FROM push.jobs") == 1, "past the memory window: a new job")
        }
    }

    @Test("two dead letters sharing an apns_id: replay --all moves one and reports the other, never aborts")
    func replayWithSharedAPNsID() async throws {
        try await TestPostgres.withDatabase { db in
            let apnsID = UUID().uuidString
            for id in [1, 2] {
                try await db.execute(
                    """
                    INSERT INTO push.dead_jobs (id, topic, device_token, payload, push_type, environment, credential,
                                                run_at, apns_id, attempts, reason, created_at, error)
                    VALUES (\(id), 'com.example.app', '\(Self.token)', '{"aps":{}}', 'alert', 'production', 'default',
                            now(), '\(apnsID)', 1, 'BadDeviceToken', now(), 'dead')
                    """
                )
            }
            let preview = try await db.queue.operations.replay(matching: .init(), dryRun: true)
            #expect(preview.moved.map(\.id) == [1] && preview.skippedConflicts == [2])
            let result = try await db.queue.operations.replay(matching: .init())
            #expect(result.moved.map(\.id) == [1] && result.skippedConflicts == [2])
            #expect(try await db.int64("SELECT count(*) FROM push.dead_jobs WHERE id = 2") == 1)
            let replayed = try #require(try await db.queue.operations.job(id: 1))
            #expect(
                replayed.historyJSON.contains("replayed"),
                "a replay keeps its history: the INSERT trigger knows it"
            )
        }
    }

    @Test("claims read what is due and claimable: not-due and excluded backlogs do not hide due jobs")
    func claimIgnoresBacklog() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, priority, run_at, credential)
                SELECT 'com.example.app', lpad(to_hex(g), 64, 'a'), '{}', 10, now() + interval '7 days', 'default'
                  FROM generate_series(1, 5000) g
                """
            )
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, priority, credential)
                SELECT 'com.example.app', lpad(to_hex(g), 64, 'b'), '{}', 10, 'paused'
                  FROM generate_series(1, 5000) g
                """
            )
            let due = try await enqueue(db, count: 5, priority: 5)
            let claimed = try await db.queue.claim(
                limit: 100,
                workerID: workerName(),
                lease: .seconds(30),
                excludingCredentials: ["paused"]
            )
            #expect(Set(claimed.map(\.id)) == Set(due))
        }
    }

    @Test("fair share and aging: another credential's due jobs and lower priorities get places in the first batch")
    func fairShareAndAging() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, priority, credential, run_at)
                SELECT 'com.example.app', lpad(to_hex(g), 64, 'a'), '{}', 10, 'big', now() - interval '1 hour'
                  FROM generate_series(1, 1000) g
                """
            )
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, priority, credential)
                SELECT 'com.example.app', lpad(to_hex(g), 64, 'b'), '{}', 10, 'small' FROM generate_series(1, 5) g
                """
            )
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, priority, credential)
                SELECT 'com.example.app', lpad(to_hex(g), 64, 'c'), '{}', 5, 'big' FROM generate_series(1, 200) g
                """
            )
            let claimed = try await db.queue.claim(limit: 100, workerID: workerName(), lease: .seconds(30))
            #expect(claimed.count == 100)
            #expect(claimed.filter { $0.credential == "small" }.count == 5, "one batch at most, whatever the backlog")
            #expect(claimed.contains { $0.priority == 5 }, "a lower priority gets places too")
            // One credential: priority 10 and 5 share a batch 8 : 2.
            try await db.execute("DELETE FROM push.jobs WHERE state = 'running' OR credential = 'small'")
            let one = try await db.queue.claim(limit: 100, workerID: workerName(), lease: .seconds(30))
            let lower = one.filter { $0.priority == 5 }.count
            #expect(
                one.count == 100 && lower >= 15 && lower <= 25,
                "priority 5 gets about 2 of every 10 places: \(lower)"
            )
            // A batch smaller than the ranges: the first job of every range still goes first (no starvation).
            let small = try await db.queue.claim(limit: 2, workerID: workerName(), lease: .seconds(30))
            #expect(Set(small.map(\.priority)) == [10, 5], "\(small.map(\.priority))")
        }
    }

    @Test("the sql/ files applied by hand, in order, then push-worker migrate: nothing left to apply, no error")
    func handAppliedMigrations() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute("DROP SCHEMA push CASCADE")
            for migration in Migration.all {
                for statement in SQLScript.statements(in: migration.sql) {
                    try await db.execute(statement)
                }
            }
            let applied = try await Migrator(client: db.client, logger: db.logger).migrate()
            #expect(applied.isEmpty)
            #expect(try await db.int64("SELECT count(*) FROM push.schema_migrations") == Int64(Migration.all.count))
        }
    }
}

extension HostileInputTests {
    @Test("the operator's guide's producer role: it enqueues idempotently and cannot read the provider tokens")
    func producerRoleRecipe() async throws {
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
            let role = "app_producer_\(UInt32.random(in: 0...UInt32.max))"
            let statements = ("CREATE ROLE app_producer" + recipe).replacingOccurrences(of: "app_producer", with: role)
                .replacingOccurrences(of: "PASSWORD '…'", with: "")
            for statement in SQLScript.statements(in: statements) { try await db.execute(statement) }
            // One connection (maxConnections: 1): SET ROLE holds for what follows.
            try await db.execute("SET ROLE \(role)")
            let apnsID = UUID().uuidString
            for _ in 0..<2 {
                try await db.execute(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload, apns_id)
                    VALUES ('com.example.app', '\(Self.token)', '{"aps":{}}', '\(apnsID)')
                    ON CONFLICT (apns_id) DO NOTHING
                    """
                )
            }
            #expect(try await db.int64("SELECT count(*) FROM push.jobs") == 1)
            let denied = await #expect(throws: PSQLError.self) {
                try await db.execute("SELECT * FROM push.provider_tokens")
            }
            #expect(denied?.serverInfo?[.sqlState] == "42501")
            await #expect(throws: PSQLError.self) {
                try await db.execute("UPDATE push.jobs SET attempts = 32767")
            }
            try await db.execute("RESET ROLE")
            try await db.execute("DROP OWNED BY \(role)")
            try await db.execute("DROP ROLE \(role)")
        }
    }
}

extension HostileInputTests {
    @Test("queue gauges: one live worker of the fleet counts (the smallest id), from partial indexes")
    func gaugesElectOneWorker() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await enqueue(db, count: 7)
            _ = try await enqueue(db, count: 3, runAt: "now() + interval '1 hour'")
            let claimed = try await db.queue.claim(limit: 2, workerID: "w-b", lease: .seconds(30))
            #expect(claimed.count == 2)
            for worker in ["w-b", "w-a", "w-c"] {
                try await db.queue.heartbeat(workerID: worker, host: "h", pid: 1, credentials: ["default"])
            }
            // Live means a heartbeat within `staleAfter`: 60 s here, as the test's own statements can take
            // seconds each on a machine the parallel suite loads; staleness is set by hand below.
            let staleAfter = Duration.seconds(60)
            let a = try #require(try await db.queue.gauges(workerID: "w-a", staleAfter: staleAfter))
            #expect(a.pending == 8 && a.running == 2 && a.deadLetters == 0 && a.oldestDueAgeSeconds >= 0)
            #expect(try await db.queue.gauges(workerID: "w-b", staleAfter: staleAfter) == nil)
            #expect(try await db.queue.gauges(workerID: "w-c", staleAfter: staleAfter) == nil)
            // w-a stops (or goes stale): the next smallest live id counts.
            try await db.queue.deregister(workerID: "w-a")
            #expect(try await db.queue.gauges(workerID: "w-a", staleAfter: staleAfter) == nil)
            #expect(try await db.queue.gauges(workerID: "w-b", staleAfter: staleAfter) != nil)
            try await db.execute(
                "UPDATE push.workers SET heartbeat_at = now() - interval '2 minutes' WHERE worker_id = 'w-b'"
            )
            #expect(try await db.queue.gauges(workerID: "w-c", staleAfter: staleAfter) != nil)
        }
    }
}

extension HostileInputTests {
    @Test("replaying a dead letter whose expires_at has passed says so, and --expires-in gives it a new one")
    func replayExpired() async throws {
        try await TestPostgres.withDatabase { db in
            for (id, expires) in [(1, "now() - interval '1 hour'"), (2, "NULL")] {
                try await db.execute(
                    """
                    INSERT INTO push.dead_jobs (id, topic, device_token, payload, push_type, environment, credential,
                                                run_at, apns_id, attempts, reason, created_at, error, expires_at)
                    VALUES (\(id), 'com.example.app', '\(Self.token)', '{"aps":{}}', 'alert', 'production', 'default',
                            now(), gen_random_uuid(), 1, 'Expired', now(), 'expired', \(expires))
                    """
                )
            }
            let preview = try await db.queue.operations.replay(matching: .init(reason: "Expired"), dryRun: true)
            #expect(preview.moved.map(\.expired) == [true, false])
            let fixed = try await db.queue.operations.replay(
                matching: .init(ids: [1]),
                expiresIn: .seconds(3600),
                dryRun: true
            )
            #expect(fixed.moved.map(\.expired) == [false])
            let moved = try await db.queue.operations.replay(matching: .init(ids: [1]), expiresIn: .seconds(3600))
            #expect(moved.moved.map(\.expired) == [false])
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE id = 1 AND expires_at > now() + interval '59 minutes'"
                ) == 1
            )
        }
    }
}

extension HostileInputTests {
    @Test(
        "upgrading a v3 queue: rows that break the new rules become dead letters with the rule named; no valid job is lost"
    )
    func upgradeFromVersion3() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute("DROP SCHEMA push CASCADE")
            try await Migrator(client: db.client, migrations: Array(Migration.all.prefix(3)), logger: db.logger)
                .migrate()
            // Version 3 accepted all of these.
            try await db.execute(
                """
                INSERT INTO push.jobs (id, topic, device_token, payload, collapse_id, run_at) VALUES
                  (100, 'com.example.app', '\(Self.token)', '{"aps":{}}', NULL, now()),
                  (200, 'com.example.app', 'not-hex', '{"aps":{}}', NULL, now()),
                  (300, 'com.example.app', '\(Self.token)', '{"aps":{}}', 'a' || chr(10), now()),
                  (400, 'com.example.app', '\(Self.token)', '{"aps":{}}', NULL, 'infinity')
                """
            )
            // An old dead letter holds id 300 (an explicit id re-used by a producer before version 4).
            try await db.execute(
                """
                INSERT INTO push.dead_jobs (id, topic, device_token, payload, push_type, environment, credential,
                                            run_at, apns_id, attempts, reason, created_at, error)
                VALUES (300, 'com.example.app', '\(Self.token)', '{"aps":{}}', 'alert', 'production', 'default',
                        now(), gen_random_uuid(), 1, 'BadDeviceToken', now(), 'old')
                """
            )
            try await Migrator(client: db.client, logger: db.logger).migrate()
            #expect(try await db.int64s("SELECT id FROM push.jobs ORDER BY id") == [100], "the valid job stays")
            let rows = try await db.client.query(
                "SELECT id, reason, error FROM push.dead_jobs ORDER BY id"
            ).decode((Int64, String, String).self).collect()
            #expect(rows.map(\.0) == [200, 300, 400])
            #expect(rows.allSatisfy { $0.1 == "InvalidJob" })
            #expect(rows[0].2.contains("device_token_must_be_hex_of_16_to_200_bytes"))
            #expect(
                rows[1].2.contains("collapse_id_must_not_contain_control_characters") && rows[1].2.contains("merged")
            )
            #expect(rows[2].2.contains("run_at_must_be_finite"))
            // The queue claims on: nothing left that the new constraints would refuse on UPDATE.
            #expect(try await db.queue.claim(limit: 10, workerID: workerName(), lease: .seconds(30)).map(\.id) == [100])
            // A replay of a dead letter that breaks a rule reports it and moves the rest (run_at is reset by
            // a replay, so 400 can go back).
            let replay = try await db.queue.operations.replay(matching: .init())
            #expect(replay.moved.map(\.id) == [400] && replay.skippedInvalid.map(\.id) == [200, 300])
            #expect(replay.skippedInvalid.first?.rule == "device_token_must_be_hex_of_16_to_200_bytes")
        }
    }

    @Test("a producer cannot switch the INSERT trigger off: push.internal_insert counts only for the schema's owner")
    func triggerBypassRefused() async throws {
        try await TestPostgres.withDatabase(maxConnections: 1) { db in
            let role = "producer_\(UInt32.random(in: 0...UInt32.max))"
            try await db.execute("CREATE ROLE \(role)")
            try await db.execute("GRANT USAGE ON SCHEMA push TO \(role)")
            try await db.execute("GRANT INSERT ON push.jobs TO \(role)")
            try await db.execute("SET ROLE \(role)")
            try await db.execute("SET push.internal_insert = 'on'")
            try await db.execute(
                "INSERT INTO push.jobs (topic, device_token, payload, state, attempts) VALUES ('com.example.app', '\(Self.token)', '{}', 'running', 32767)"
            )
            try await db.execute("RESET ROLE")
            try await db.execute("RESET push.internal_insert")
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'pending' AND attempts = 0") == 1)
            try await db.execute("DROP OWNED BY \(role)")
            try await db.execute("DROP ROLE \(role)")
        }
    }

    @Test(
        "an outbox retry racing the dead-letter move of its apns_id is skipped at once: it waits on no worker's row"
    )
    func apnsIDRaceWithDeadLetterMove() async throws {
        try await TestPostgres.withDatabase { db in
            let apnsID = UUID().uuidString
            try await db.execute(
                "INSERT INTO push.jobs (topic, device_token, payload, apns_id) VALUES ('com.example.app', '\(Self.token)', '{}', '\(apnsID)')"
            )
            let jobs = try await db.queue.claim(limit: 1, workerID: "w", lease: .seconds(30))
            try await db.client.withConnection { mover in
                // The worker's move, held open: the row is deleted but not yet committed.
                try await mover.query("BEGIN", logger: db.logger)
                try await mover.query(
                    """
                    WITH moved AS (DELETE FROM push.jobs WHERE id = \(jobs[0].id) RETURNING *)
                    INSERT INTO push.dead_jobs (id, topic, device_token, payload, push_type, environment, credential,
                                                run_at, apns_id, attempts, reason, created_at, error)
                    SELECT id, topic, device_token, payload, push_type, environment, credential, run_at, apns_id,
                           attempts, 'BadDeviceToken', created_at, 'dead' FROM moved
                    """,
                    logger: db.logger
                )
                // The retry finishes while the move is still open (the ledger answers), inserting nothing.
                try await db.execute(
                    "INSERT INTO push.jobs (topic, device_token, payload, apns_id) VALUES ('com.example.app', '\(Self.token)', '{}', '\(apnsID)') ON CONFLICT (apns_id) DO NOTHING"
                )
                #expect(
                    try await db.int64(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    ) == 0
                )
                try await mover.query("COMMIT", logger: db.logger)
            }
            #expect(try await db.int64("SELECT count(*) FROM push.jobs") == 0, "the retry was skipped")
            #expect(try await db.int64("SELECT count(*) FROM push.dead_jobs") == 1)
        }
    }
}

/// SplitMix64, so a generated case replays from its printed seed.
private struct SeededRandom {
    var state: UInt64
    init(seed: UInt64) { self.state = seed }
    mutating func next() -> UInt64 {
        self.state &+= 0x9E37_79B9_7F4A_7C15
        var z = self.state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
