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
}
