public import Logging
public import PostgresNIO
public import PushCore

/// Creates or upgrades the `push` schema: applies the embedded migrations in order, records each in
/// `push.schema_migrations`, and is safe when several workers start at once.
///
/// Every run takes a session-level advisory lock first (polled), so concurrent migrators queue behind one
/// another; the second finds everything recorded and applies nothing. Each file runs in one transaction with
/// a lock timeout (retried), its record included; a file's statements after
/// ``outsideTransactionMarker`` run after that, one at a time, and the record waits for them. Every statement
/// there is idempotent, so a migrator that died half way runs the file again.
public struct Migrator: Sendable {
    /// The advisory lock key every migrator takes (`pg_advisory_xact_lock`): "pushwkr" as an integer.
    public static let advisoryLockKey: Int64 = 0x7075_7368_776B_72

    let client: PostgresClient
    let migrations: [Migration]
    let logger: Logger

    /// - Parameters:
    ///   - client: a running client for the target database.
    ///   - migrations: what to apply; the embedded set unless a test says otherwise.
    ///   - clock: the clock of the waits for the lock (the process's; a test's or a tool's own by default).
    public init(
        client: PostgresClient,
        migrations: [Migration] = Migration.all,
        logger: Logger,
        clock: any PushClock = ContinuousClock()
    ) {
        self.clock = clock
        self.client = client
        self.migrations = migrations.sorted { $0.version < $1.version }
        self.logger = logger
    }

    /// How long one statement of a migration waits for a table lock before it gives up and the file is
    /// tried again (producers queue behind a waiting ALTER TABLE: a short wait keeps them moving).
    public var lockTimeout: Duration = .seconds(2)
    /// How many times a file whose lock wait timed out is tried again before `migrate` fails.
    public var lockRetries = 60
    /// The clock of the waits for the lock.
    public let clock: any PushClock
    /// How long `migrate` waits for another migrator to finish before it fails.
    public var lockWait: Duration = .seconds(600)

    /// The line that ends a file's transactional part: the statements after it run one by one outside a
    /// transaction (`CREATE INDEX CONCURRENTLY`, `VALIDATE CONSTRAINT`), without a lock timeout (they take no
    /// lock a producer waits on; see `migrate`), and the version is recorded once they all ran. Each must be idempotent: a migrator that died half way runs
    /// the whole file again.
    public static let outsideTransactionMarker = "-- push:outside-transaction"

    /// Applies every migration not yet recorded and returns the ones it applied (empty when up to date).
    ///
    /// One transaction per file, each statement with ``lockTimeout``: a file that cannot get its lock in
    /// time (a long transaction holds the table) is rolled back and tried again after a pause, so producers
    /// never queue behind a migration for longer than the timeout. A session-level advisory lock keeps
    /// concurrent migrators in line across files.
    @discardableResult
    public func migrate() async throws -> [Migration] {
        let migrations = self.migrations
        let logger = self.logger
        do {
            return try await self.client.withConnection { connection in
                // Polled, not waited for: a session waiting in pg_advisory_lock holds a snapshot, and the
                // holder's CREATE INDEX CONCURRENTLY waits for every older snapshot to end.
                let deadline = self.clock.now + self.lockWait
                var backend: Int32 = 0
                while true {
                    let rows = try await connection.query(
                        MigrationsSQL.tryLock.query { $0.bind("key", Self.advisoryLockKey) },
                        logger: logger
                    )
                    var locked = false
                    for try await (got, pid) in rows.decode((Bool, Int32).self) { (locked, backend) = (got, pid) }
                    if locked { break }
                    guard self.clock.now < deadline else {
                        throw QueueError(
                            code: .migrationFailed,
                            message:
                                "another migrator has held the migration lock for \(self.lockWait) (pg_locks: advisory lock \(Self.advisoryLockKey)); if none runs, a session that died behind a transaction pooler may still hold it: end that server connection, then run push-worker migrate again"
                        )
                    }
                    try await Task.sleep(for: .milliseconds(100))
                }
                do {
                    // A worker's sessions stop any statement at its statement deadline (statement_timeout);
                    // a migration's index build may take longer. RESET returns the connection to its session
                    // default before the pool hands it on.
                    try await connection.query(MigrationsSQL.noStatementTimeout.query(), logger: logger)
                    let applied = try await self.apply(migrations, on: connection, session: backend)
                    try await connection.query(MigrationsSQL.resetStatementTimeout.query(), logger: logger)
                    try await connection.query(
                        MigrationsSQL.unlock.query { $0.bind("key", Self.advisoryLockKey) },
                        logger: logger
                    )
                    return applied
                } catch {
                    _ = try? await connection.query(MigrationsSQL.rollback.query(), logger: logger)
                    _ = try? await connection.query(MigrationsSQL.resetStatementTimeout.query(), logger: logger)
                    _ = try? await connection.query(
                        MigrationsSQL.unlock.query { $0.bind("key", Self.advisoryLockKey) },
                        logger: logger
                    )
                    throw error
                }
            }
        } catch let error as QueueError {
            throw error
        } catch {
            throw QueueError.migrationFailed(underlying: error)
        }
    }

    private func apply(
        _ migrations: [Migration],
        on connection: PostgresConnection,
        session: Int32
    ) async throws -> [Migration] {
        let logger = self.logger
        try await connection.query(MigrationsSQL.createSchema.query(), logger: logger)
        try await connection.query(MigrationsSQL.createLedger.query(), logger: logger)
        var applied: Set<Int> = []
        for try await version in try await connection.query(MigrationsSQL.appliedVersions.query(), logger: logger)
            .decode(Int32.self)
        {
            applied.insert(Int(version))
        }
        let timeoutMs = max(self.lockTimeout.milliseconds, 1)
        var newlyApplied: [Migration] = []
        for migration in migrations where !applied.contains(migration.version) {
            try await self.requireOneSession(connection, session)
            let parts = migration.sql.components(separatedBy: Self.outsideTransactionMarker)
            let inside = SQLScript.statements(in: parts[0])
            let outside = parts.count > 1 ? SQLScript.statements(in: parts[1...].joined(separator: "\n")) : []
            try await self.retryingLockTimeouts(migration.name, on: connection) {
                try await connection.query(MigrationsSQL.begin.query(), logger: logger)
                try await connection.query(
                    MigrationsSQL.lockTimeout.query { $0.bind("timeout", "\(timeoutMs)ms") },
                    logger: logger
                )
                for statement in inside {
                    try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
                if outside.isEmpty { try await self.record(migration, on: connection) }
                try await connection.query(MigrationsSQL.commit.query(), logger: logger)
            }
            if !outside.isEmpty {
                // No lock timeout here: these statements take no lock a producer waits on, and a concurrent
                // index build waits for every older transaction in the database (a report, pg_dump): timing it
                // out would throw away a finished build.
                for statement in outside {
                    try await self.retryingLockTimeouts(migration.name, on: connection) {
                        try await self.dropInvalidIndex(before: statement, on: connection)
                        try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                    }
                }
                try await self.record(migration, on: connection)
            }
            logger.info("applied migration", metadata: ["push.migration": "\(migration.name)"])
            newlyApplied.append(migration)
        }
        return newlyApplied
    }

    /// The migration lock and the statements after it need one database session. Behind a transaction
    /// pooler (PgBouncer in transaction mode) each statement may run on another server connection: say so
    /// instead of applying files without the lock.
    private func requireOneSession(_ connection: PostgresConnection, _ session: Int32) async throws {
        for try await pid in try await connection.query(MigrationsSQL.backendPID.query(), logger: self.logger)
            .decode(Int32.self) where pid != session
        {
            throw QueueError(
                code: .migrationFailed,
                message:
                    "push-worker migrate needs one database session, but its statements ran on different server connections (a transaction pooler such as PgBouncer in transaction mode): run it against Postgres directly or through a session-mode pool, and start workers behind the pooler with --migrations check"
            )
        }
    }

    private func record(_ migration: Migration, on connection: PostgresConnection) async throws {
        try await connection.query(
            MigrationsSQL.record.query {
                $0.bind("version", Int32(migration.version))
                $0.bind("name", migration.name)
            },
            logger: self.logger
        )
    }

    /// Runs `body`; when a statement's lock wait timed out (SQLSTATE 55P03) or it was chosen as a deadlock's
    /// victim (40P01: an older worker starting now waits in its transaction-scoped migration lock while an
    /// index build waits for its snapshot), rolls back, waits, and runs it again, up to ``lockRetries`` times.
    private func retryingLockTimeouts(
        _ name: String,
        on connection: PostgresConnection,
        _ body: () async throws -> Void
    ) async throws {
        var tries = 0
        while true {
            do {
                return try await body()
            } catch let error as PSQLError
                where ["55P03", "40P01"].contains(error.serverInfo?[.sqlState] ?? "") && tries < self.lockRetries
            {
                tries += 1
                // Outside a transaction ROLLBACK only warns.
                _ = try? await connection.query(MigrationsSQL.rollback.query(), logger: self.logger)
                self.logger.warning(
                    "a migration waited too long for a table lock (a long transaction holds it); trying again",
                    metadata: ["push.migration": "\(name)", "push.try": "\(tries)"]
                )
                try await Task.sleep(for: .milliseconds(min(250 * tries, 5_000)))
            }
        }
    }

    /// A `CREATE INDEX CONCURRENTLY IF NOT EXISTS` that failed half way leaves an invalid index behind, which
    /// `IF NOT EXISTS` would then keep: drop it first.
    private func dropInvalidIndex(before statement: String, on connection: PostgresConnection) async throws {
        let words = statement.split(whereSeparator: \.isWhitespace).map { $0.lowercased() }
        guard words.count > 6, words[0] == "create", words[1] == "index", words[2] == "concurrently",
            words[3] == "if", words[4] == "not", words[5] == "exists"
        else { return }
        let name = words[6]
        let qualified = name.contains(".") ? name : "push.\(name)"
        let rows = try await connection.query(
            MigrationsSQL.indexInvalid.query { $0.bind("index", qualified) },
            logger: self.logger
        )
        for try await invalid in rows.decode(Bool.self) where invalid {
            try await connection.query(
                MigrationsSQL.dropIndex.query(identifier: qualified),
                logger: self.logger
            )
        }
    }

    /// The versions recorded in `push.schema_migrations`, or empty when the schema was never migrated.
    public func appliedVersions() async throws -> [Int] {
        let exists = try await self.client.query(MigrationsSQL.ledgerExists.query(), logger: self.logger)
            .decode(Bool.self)
        for try await present in exists where !present { return [] }
        var versions: [Int] = []
        for try await version in try await self.client.query(MigrationsSQL.appliedVersions.query(), logger: self.logger)
            .decode(Int32.self)
        {
            versions.append(Int(version))
        }
        return versions
    }

    /// The embedded migrations the database has not recorded yet (empty when the schema is current).
    public func pending() async throws -> [Migration] {
        let applied = Set(try await self.appliedVersions())
        return self.migrations.filter { !applied.contains($0.version) }
    }

    /// Throws ``QueueError/Code/schemaMissing`` when the database lacks a migration this build has; for
    /// workers that must not change the schema themselves (a deploy runs `push-worker migrate` once).
    /// A schema newer than this build is accepted: migrations only add, so an older worker keeps working.
    public func requireCurrent() async throws {
        let applied = try await self.appliedVersions()
        let missing = self.migrations.filter { !applied.contains($0.version) }
        guard !missing.isEmpty else { return }
        let at = applied.last.map { "is at version \($0)" } ?? "does not exist yet"
        throw QueueError(
            code: .schemaMissing,
            message:
                "the push schema \(at) and lacks \(missing.map(\.name).joined(separator: ", ")), which this build needs: apply the migrations first (push-worker migrate)"
        )
    }
}

/// The statements of `Statements/migrations.sql`, with their binds in order.
enum MigrationsSQL: StatementFile {
    static let file = "migrations"

    static let tryLock = named("try_lock", "key")
    static let unlock = named("unlock", "key")
    static let noStatementTimeout = named("no_statement_timeout")
    static let resetStatementTimeout = named("reset_statement_timeout")
    static let createSchema = named("create_schema")
    static let createLedger = named("create_ledger")
    static let ledgerExists = named("ledger_exists")
    static let appliedVersions = named("applied_versions")
    static let record = named("record", "version", "name")
    static let backendPID = named("backend_pid")
    static let lockTimeout = named("lock_timeout", "timeout")
    static let indexInvalid = named("index_invalid", "index")
    static let begin = named("begin")
    static let commit = named("commit")
    static let rollback = named("rollback")
    static let dropIndex = named("drop_index")

    static let all = [
        tryLock, unlock, noStatementTimeout, resetStatementTimeout, createSchema, createLedger, ledgerExists,
        appliedVersions, record, backendPID, lockTimeout, indexInvalid, begin, commit, rollback, dropIndex,
    ]
}
