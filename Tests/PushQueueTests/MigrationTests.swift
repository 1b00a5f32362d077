import Foundation
import Logging
import PostgresNIO
import PushQueueTesting
import Testing

@testable import PushQueue

@Suite("Migrations")
struct MigrationTests {
    @Test("migrate is idempotent and safe when several workers start at once")
    func concurrentMigrate() async throws {
        try await TestPostgres.withDatabase { db in
            // The test database is already migrated once; drop the schema to start clean.
            try await db.execute("DROP SCHEMA push CASCADE")
            let results = try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<6 {
                    group.addTask { try await Migrator(client: db.client, logger: db.logger).migrate().count }
                }
                var counts: [Int] = []
                for try await count in group { counts.append(count) }
                return counts
            }
            #expect(results.sorted() == [0, 0, 0, 0, 0, Migration.all.count])
            #expect(try await Migrator(client: db.client, logger: db.logger).migrate().isEmpty)
            #expect(
                try await Migrator(client: db.client, logger: db.logger).appliedVersions()
                    == Migration.all.map(\.version)
            )
        }
    }

    @Test("the sql/ files on disk are the ones the binary embeds")
    func embeddedMatchesDisk() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let files = try FileManager.default.contentsOfDirectory(atPath: root.appendingPathComponent("sql").path)
            .filter { $0.hasSuffix(".sql") }.sorted()
        #expect(files == Migration.all.map(\.name))
        for migration in Migration.all {
            let text = try String(contentsOf: root.appendingPathComponent("sql/\(migration.name)"), encoding: .utf8)
            #expect(text == migration.sql)
        }
    }

    @Test("the SQL splitter keeps dollar quotes, strings and comments intact")
    func splitter() {
        let script = """
            -- a comment; with a semicolon
            CREATE TABLE t (a text DEFAULT 'x;y');
            /* block; comment */
            CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$;
            CREATE FUNCTION g() RETURNS int LANGUAGE plpgsql AS $body$ BEGIN RETURN 2; END $body$;
            SELECT "odd;name" FROM t
            """
        let statements = SQLScript.statements(in: script)
        #expect(statements.count == 4)
        #expect(statements[0] == "CREATE TABLE t (a text DEFAULT 'x;y')")
        #expect(statements[1].hasSuffix("$$ SELECT 1; $$"))
        #expect(statements[2].contains("$body$ BEGIN RETURN 2; END $body$"))
        #expect(statements[3] == "SELECT \"odd;name\" FROM t")
    }

    @Test("DATABASE_URL parsing names what is wrong and masks the password")
    func databaseURL() throws {
        let url = try DatabaseURL("postgres://app:s%40cret@db.internal:6543/push?sslmode=require")
        #expect(url.host == "db.internal" && url.port == 6543 && url.username == "app" && url.password == "s@cret")
        #expect(url.database == "push" && url.sslMode == "require")
        #expect(!url.description.contains("cret"))
        #expect(try DatabaseURL("postgresql://localhost").database == "postgres")
        #expect(throws: QueueError.self) { try DatabaseURL("mysql://localhost/x") }
        #expect(throws: QueueError.self) { try DatabaseURL("postgres://localhost/x?sslmode=maybe") }
    }

    @Test("libpq's multi-host URLs: hosts in order, target_session_attrs, connect_timeout; the unsupported named")
    func multiHostURL() throws {
        let url = try DatabaseURL(
            "postgres://app:pw@db1:5432,db2,[::1]:5433/push?target_session_attrs=read-write&connect_timeout=5"
        )
        #expect(url.hosts.map(\.description) == ["db1:5432", "db2:5432", "[::1]:5433"])
        #expect(url.host == "db1" && url.port == 5432 && url.database == "push" && url.password == "pw")
        #expect(url.targetSessionAttrs == "read-write" && url.connectTimeout == 5)
        #expect(url.description.contains("db1:5432,db2:5432,[::1]:5433") && !url.description.contains("pw"))
        #expect(url.connectionString.contains("@db1:5432,db2:5432,[::1]:5433/push"))
        #expect(try DatabaseURL("postgres://u@h/x?target_session_attrs=primary").targetSessionAttrs == "primary")
        #expect(try DatabaseURL("postgres://u@h/x?connect_timeout=1").connectTimeout == 2, "libpq: 1 counts as 2")
        for bad in [
            "postgres://u@db1,,db2/x", "postgres://u@db1:99999,db2/x", "postgres://u@h/x?target_session_attrs=standby",
            "postgres://u@h/x?connect_timeout=soon", "postgres://u@h/x?application_name=me",
        ] {
            do {
                _ = try DatabaseURL(bad)
                Issue.record("accepted \(bad)")
            } catch let error as QueueError {
                #expect(error.message.contains("DATABASE_URL"), "\(bad): \(error.message)")
            }
        }
    }

    @Test("the start-up durability sentence: synchronous, asynchronous, single server")
    func durabilitySentence() {
        let sync = JobQueue.durabilitySentence(
            synchronousCommit: "remote_apply",
            synchronousStandbyNames: "ANY 1 (s1, s2)",
            streamingStandbys: 2
        )
        #expect(sync.hasPrefix("synchronous replication") && sync.contains("no committed job or outcome is lost"))
        let async = JobQueue.durabilitySentence(
            synchronousCommit: "on",
            synchronousStandbyNames: "",
            streamingStandbys: 1
        )
        #expect(async.hasPrefix("asynchronous replication") && async.contains("can lose"))
        // synchronous_standby_names set but commits that do not wait for it: asynchronous in effect.
        let local = JobQueue.durabilitySentence(
            synchronousCommit: "local",
            synchronousStandbyNames: "s1",
            streamingStandbys: 1
        )
        #expect(local.hasPrefix("asynchronous replication"))
        #expect(
            JobQueue.durabilitySentence(synchronousCommit: "on", synchronousStandbyNames: "", streamingStandbys: 0)
                .hasPrefix("a single server")
        )
    }
}
