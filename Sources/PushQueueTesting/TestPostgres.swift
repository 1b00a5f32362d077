import Foundation
public import Logging
public import PostgresNIO
import PushEmbeddedPostgres
import PushProcess
public import PushQueue
import Synchronization

/// Real Postgres for tests: the server named by `DATABASE_URL`, or else a throwaway cluster started once
/// per test process (in a temporary directory, fsync off, stopped and removed at exit). Each test gets a
/// database of its own, migrated, and dropped afterwards, so tests run in parallel without sharing rows.
public enum TestPostgres {
    private static let server = Mutex<Result<DatabaseURL, any Error>?>(nil)

    /// The server every test database lives on; starts the embedded cluster on first use.
    public static func serverURL() throws -> DatabaseURL {
        TestWatchdog.start()
        return try self.server.withLock { state in
            if let state { return try state.get() }
            let result = Result { try Self.startServer() }
            state = result
            if case .success(let url) = result {
                _ = TestWatchdog.addReport { Self.activityReport(url) }
            }
            return try result.get()
        }
    }

    private static func startServer() throws -> DatabaseURL {
        if let url = ProcessInfo.processInfo.environment["DATABASE_URL"], !url.isEmpty {
            return try DatabaseURL(url)
        }
        let directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("pushworker-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))").path
        var logger = Logger(label: "push.test.postgres")
        logger.logLevel = .warning
        let cluster = EmbeddedPostgres(
            // Prepared transactions on: a test shows producers can use two-phase commit in poll-only mode.
            configuration: .init(
                dataDirectory: directory + "/data",
                fsync: false,
                settings: ["max_prepared_transactions": "10"]
            ),
            logger: logger
        )
        let url = try cluster.start()
        EmbeddedClusterRegistry.register(cluster, directory: directory)
        return url
    }

    /// What the server's sessions are doing, for the watchdog: every session that is not idle, what it
    /// waits for and who blocks it, and any prepared transaction (which holds its locks until resolved).
    public static func activityReport(_ server: DatabaseURL) -> String {
        let psql =
            ((try? EmbeddedPostgres.findBinDirectory()).map { $0 + "/psql" }).flatMap {
                FileManager.default.isExecutableFile(atPath: $0) ? $0 : nil
            } ?? "psql"
        let sql = """
            SELECT pid, datname, backend_type, state, wait_event_type || ':' || wait_event AS waits_for,
                   pg_blocking_pids(pid) AS blocked_by, round(extract(epoch FROM now() - query_start)) AS seconds,
                   left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query
              FROM pg_stat_activity
             WHERE state IS DISTINCT FROM 'idle' AND pid <> pg_backend_pid() AND backend_type = 'client backend';
            SELECT gid, database, prepared FROM pg_prepared_xacts;
            SELECT datname, usename, state, count(*) AS sessions, current_setting('max_connections') AS max
              FROM pg_stat_activity WHERE backend_type = 'client backend' GROUP BY 1, 2, 3 ORDER BY 4 DESC LIMIT 12;
            """
        let result = try? ChildProcess.run(
            "/usr/bin/env",
            ["PGCONNECT_TIMEOUT=5", psql, server.connectionString, "-X", "-c", sql],
            limit: .seconds(30)
        )
        return "the test cluster's sessions that are not idle:\n" + (result?.output ?? "(psql could not be started)\n")
    }

    /// The embedded cluster's migrated template, made once: a test database is a copy of it (`CREATE
    /// DATABASE … TEMPLATE`), not a new migration each time (19 migrations a test, a third of a second of
    /// Postgres and client CPU, some 200 times a run). `nil` on a server named by `DATABASE_URL`, which
    /// keeps nothing between runs: each database is migrated.
    private static let template = Mutex<Task<String, any Error>?>(nil)

    private static func templateDatabase(_ server: DatabaseURL) async throws -> String? {
        if let url = ProcessInfo.processInfo.environment["DATABASE_URL"], !url.isEmpty { return nil }
        let task = Self.template.withLock { task in
            if let task { return task }
            let made = Task {
                let name = "pw_template_\(UInt64.random(in: 0...UInt64.max))"
                try await self.admin(server) { client in
                    try await client.query("CREATE DATABASE \(unescaped: name)")
                }
                try await self.migrated(server.with(database: name), maxConnections: 1) { _ in }
                return name
            }
            task = made
            return made
        }
        return try await task.value
    }

    /// Runs `body` against a fresh, migrated database, then drops it.
    public static func withDatabase<T: Sendable>(
        maxConnections: Int = 20,
        _ body: @Sendable (TestDatabase) async throws -> T
    ) async throws -> T {
        let server = try self.serverURL()
        let name = "pw_test_\(UInt64.random(in: 0...UInt64.max))"
        let template = try await self.templateDatabase(server)
        try await self.admin(server) { client in
            if let template {
                try await client.query("CREATE DATABASE \(unescaped: name) TEMPLATE \(unescaped: template)")
            } else {
                try await client.query("CREATE DATABASE \(unescaped: name)")
            }
        }
        let result: Result<T, any Error>
        do {
            result = .success(
                try await self.migrated(server.with(database: name), maxConnections: maxConnections, body)
            )
        } catch {
            result = .failure(error)
        }
        try? await self.admin(server) { client in
            try await client.query("DROP DATABASE IF EXISTS \(unescaped: name) WITH (FORCE)")
        }
        return try result.get()
    }

    /// Runs `body` with a client on `url`'s database once it is migrated (a copy of the template already is:
    /// the migrator finds nothing to do).
    private static func migrated<T: Sendable>(
        _ url: DatabaseURL,
        maxConnections: Int,
        _ body: @Sendable (TestDatabase) async throws -> T
    ) async throws -> T {
        var logger = Logger(label: "push.test")
        logger.logLevel = .error
        var configuration = url.clientConfiguration
        configuration.options.maximumConnections = maxConnections
        // A test's own statement that waits (on a lock a worker holds, say) fails after two minutes with
        // Postgres' message and the test's line, instead of hanging the run until the watchdog stops it.
        configuration.options.additionalStartupParameters.append(("statement_timeout", "120s"))
        // As the worker's sessions (JobQueue.workerSessionSettings): the claim's estimate crosses JIT's
        // threshold on a fresh table, and compiling it takes a second or two per claim; nothing here benefits.
        configuration.options.additionalStartupParameters.append(("jit", "off"))
        let client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        let result: Result<T, any Error> = await withTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            do {
                try await Migrator(client: client, logger: logger).migrate()
                let database = TestDatabase(url: url, client: client, logger: logger)
                return .success(try await body(database))
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    /// Runs `body` with a short-lived client on the server's maintenance database.
    private static func admin(
        _ server: DatabaseURL,
        _ body: @Sendable (PostgresClient) async throws -> Void
    ) async throws {
        let client = PostgresClient(configuration: server.clientConfiguration)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            try await body(client)
        }
    }
}

/// One test's database: its URL (for psql or a second connection), a running client and a queue on it.
public struct TestDatabase: Sendable {
    /// The database's URL.
    public let url: DatabaseURL
    /// A running client.
    public let client: PostgresClient
    /// A logger at warning level.
    public let logger: Logger

    /// A queue on this database.
    public var queue: JobQueue { JobQueue(client: self.client, logger: self.logger, clock: ContinuousClock()) }

    /// How long a test's own statement is waited for: past the server's `statement_timeout` (120 s), so only a
    /// client that never answers reaches it, and the test fails naming the statement instead of hanging the run.
    public static let clientDeadline: Duration = .seconds(150)

    /// Runs one statement given as plain SQL text (as a producer would send it).
    public func execute(_ sql: String) async throws {
        try await self.bounded(PostgresQuery(unsafeSQL: sql)) { rows in for try await _ in rows {} }
    }

    /// Runs a query and decodes its single `bigint` column.
    public func int64s(_ query: PostgresQuery) async throws -> [Int64] {
        try await self.bounded(query) { rows in
            var values: [Int64] = []
            for try await value in rows.decode(Int64.self) { values.append(value) }
            return values
        }
    }

    /// Runs a query that returns one `bigint` (e.g. a count).
    public func int64(_ query: PostgresQuery) async throws -> Int64 {
        try await self.int64s(query).first ?? 0
    }

    /// Runs a query that returns one `float8` (a duration in seconds, an average).
    public func double(_ query: PostgresQuery) async throws -> Double {
        try await self.bounded(query) { rows in
            var first: Double?
            for try await value in rows.decode(Double?.self) { first = first ?? value ?? 0 }
            return first ?? 0
        }
    }

    /// Runs `query` and reads its rows with `read`, waiting at most ``clientDeadline`` for both.
    private func bounded<T: Sendable>(
        _ query: PostgresQuery,
        _ read: @escaping @Sendable (PostgresRowSequence) async throws -> T
    ) async throws -> T {
        let (client, logger) = (self.client, self.logger)
        return try await withDeadline(Self.clientDeadline, "the test's statement \(query.sql.prefix(200))") {
            try await read(try await client.query(query, logger: logger))
        }
    }
}

/// Stops the embedded cluster when the test process exits.
enum EmbeddedClusterRegistry {
    private static let cluster = Mutex<(EmbeddedPostgres, String)?>(nil)

    static func register(_ cluster: EmbeddedPostgres, directory: String) {
        self.cluster.withLock { $0 = (cluster, directory) }
        atexit {
            if let (cluster, directory) = EmbeddedClusterRegistry.cluster.withLock({ $0 }) {
                cluster.stop()
                try? FileManager.default.removeItem(atPath: directory)
            }
        }
    }
}
