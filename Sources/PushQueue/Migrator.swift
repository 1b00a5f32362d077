public import Logging
public import PostgresNIO

/// Creates or upgrades the `push` schema: applies the embedded migrations in order, records each in
/// `push.schema_migrations`, and is safe when several workers start at once.
///
/// Every run takes a transaction-scoped advisory lock first, so concurrent migrators queue behind one
/// another; the second finds everything recorded and applies nothing. A migration and its record commit
/// together, so a failure leaves the schema at the last whole version.
public struct Migrator: Sendable {
    /// The advisory lock key every migrator takes (`pg_advisory_xact_lock`): "pushwkr" as an integer.
    public static let advisoryLockKey: Int64 = 0x7075_7368_776B_72

    let client: PostgresClient
    let migrations: [Migration]
    let logger: Logger

    /// - Parameters:
    ///   - client: a running client for the target database.
    ///   - migrations: what to apply; the embedded set unless a test says otherwise.
    public init(client: PostgresClient, migrations: [Migration] = Migration.all, logger: Logger) {
        self.client = client
        self.migrations = migrations.sorted { $0.version < $1.version }
        self.logger = logger
    }

    /// Applies every migration not yet recorded and returns the ones it applied (empty when up to date).
    @discardableResult
    public func migrate() async throws -> [Migration] {
        let migrations = self.migrations
        let logger = self.logger
        do {
            return try await self.client.withTransaction(logger: logger) { connection in
                try await connection.query("SELECT pg_advisory_xact_lock(\(Self.advisoryLockKey))", logger: logger)
                try await connection.query("CREATE SCHEMA IF NOT EXISTS push", logger: logger)
                try await connection.query(
                    """
                    CREATE TABLE IF NOT EXISTS push.schema_migrations (
                        version integer PRIMARY KEY,
                        name text NOT NULL,
                        applied_at timestamptz NOT NULL DEFAULT now()
                    )
                    """,
                    logger: logger
                )
                var applied: Set<Int> = []
                for try await version in try await connection.query(
                    "SELECT version FROM push.schema_migrations",
                    logger: logger
                ).decode(Int32.self) {
                    applied.insert(Int(version))
                }
                var newlyApplied: [Migration] = []
                for migration in migrations where !applied.contains(migration.version) {
                    for statement in SQLScript.statements(in: migration.sql) {
                        try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                    }
                    try await connection.query(
                        "INSERT INTO push.schema_migrations (version, name) VALUES (\(Int32(migration.version)), \(migration.name)) ON CONFLICT (version) DO NOTHING",
                        logger: logger
                    )
                    logger.info("applied migration", metadata: ["push.migration": "\(migration.name)"])
                    newlyApplied.append(migration)
                }
                return newlyApplied
            }
        } catch let error as PostgresTransactionError {
            throw QueueError.migrationFailed(
                underlying: error.closureError ?? error.commitError ?? error.beginError ?? error
            )
        }
    }

    /// The versions recorded in `push.schema_migrations`, or empty when the schema was never migrated.
    public func appliedVersions() async throws -> [Int] {
        let exists = try await self.client.query(
            "SELECT to_regclass('push.schema_migrations') IS NOT NULL",
            logger: self.logger
        ).decode(Bool.self)
        for try await present in exists where !present { return [] }
        var versions: [Int] = []
        for try await version in try await self.client.query(
            "SELECT version FROM push.schema_migrations ORDER BY version",
            logger: self.logger
        ).decode(Int32.self) {
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
