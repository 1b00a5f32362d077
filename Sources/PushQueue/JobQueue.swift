public import Logging
public import PostgresNIO
public import PushCore
import Synchronization

/// The queue's operations on `push.jobs`, `push.dead_jobs` and `push.invalid_tokens`.
///
/// Each operation is one SQL round trip (a few for dead-letter moves of many rows), built for batches:
/// the worker claims as many jobs as it can send and writes their outcomes back together. Every write of
/// an outcome is fenced on (id, attempt, worker), so a worker whose lease was lost cannot overwrite the
/// newer attempt of another.
public struct JobQueue: Sendable {
    /// The client every operation runs on, taken as each starts (a failover may switch it); the caller runs it.
    public var client: PostgresClient { self.primary.client }
    /// The client in use, switchable to another host.
    public let primary: PrimaryClient
    let logger: Logger
    /// The process's clock: the claim's round trip, the outcome write's ages.
    public let clock: any PushClock
    /// Whether the claim and the outcome write may run as named prepared statements (planned once per
    /// connection); see ``usesPreparedStatements``.
    let preparedStatements: Bool
    /// Set once a prepared statement failed on the server; shared by every copy of this queue.
    let preparedStatementFailed = PreparedStatementFailure()
    /// Where the claims' walk of topics stopped; shared by every copy of this queue.
    let claimCursor = ClaimCursorStore()

    /// - Parameters:
    ///   - client: a client whose `run()` the caller drives.
    ///   - logger: where the queue logs; job ids and apns ids only, never tokens or payloads.
    ///   - clock: the process's clock.
    ///   - preparedStatements: run the claim and the outcome write as named prepared statements: planning
    ///     them took 1–1.6 ms per batch. Off behind PgBouncer's transaction pooling, which loses named
    ///     statements (the worker turns it off with `--no-session-settings`).
    public init(client: PostgresClient, logger: Logger, clock: any PushClock, preparedStatements: Bool = false) {
        self.init(
            primary: PrimaryClient(client),
            logger: logger,
            clock: clock,
            preparedStatements: preparedStatements
        )
    }

    /// A queue on a client that a failover may switch to another host (``PrimaryClient/switchTo(_:listener:host:)``).
    public init(primary: PrimaryClient, logger: Logger, clock: any PushClock, preparedStatements: Bool = false) {
        self.primary = primary
        self.logger = logger
        self.clock = clock
        self.preparedStatements = preparedStatements
    }
}

extension JobQueue {
    /// Session settings for the worker's connections (`additionalStartupParameters`). Every query the worker
    /// runs is written for an index; a queue table swings from millions of rows to a few, and after a
    /// drain its heap stays large while its statistics say "small": the planner then prefers a sequential
    /// scan of the empty pages (measured: 226 ms instead of 1.3 ms for a claim after draining 800,000
    /// jobs) and JIT-compiles the claim (+300 ms). Neither ever pays off here.
    ///
    /// `plan_cache_mode = force_generic_plan`: the claim and the outcome write are named prepared
    /// statements, and a generic plan is the one Postgres keeps. Left to choose, it re-plans the claim on
    /// every call (1.6 ms, 16 µs per job during a drain): its estimate for the generic plan is twenty times
    /// the custom one's, while both run the same index scans in the same time. The worker's other
    /// statements are keyed by ids and run on indexes whatever their parameters.
    ///
    /// `lock_timeout = 5s`: no worker statement waits long behind another session's lock (a producer's or an
    /// operator's open transaction, a migration); it fails, and its loop tries again. Heartbeats and lease
    /// extension skip locked rows and never get there.
    public static let workerSessionSettings: [(String, String)] = [
        ("enable_seqscan", "off"), ("jit", "off"), ("plan_cache_mode", "force_generic_plan"), ("lock_timeout", "5s"),
    ]

    /// ``workerSessionSettings`` plus `statement_timeout`: the worker stops waiting for a statement at its
    /// deadline, and the server stops running it then too. Without it, an abandoned statement went on running
    /// on the server: a claim planned for an empty queue (statistics taken after a drain) ran 40 s while the
    /// worker gave up after 30 s and claimed again, until seven copies ran at once. Statements with a shorter
    /// deadline (the webhook claim) set their own in their transaction; the migrator lifts it for its run.
    ///
    /// `lock_timeout` stays under it (half of it at most): a statement waiting for a lock in its Parse fails
    /// as a lock timeout, never as a cancelled statement (which the prepared-statement fallback takes for an
    /// execution that ran).
    public static func workerSessionSettings(statementTimeout: Duration) -> [(String, String)] {
        let statement = max(statementTimeout.milliseconds, 2)
        return Self.workerSessionSettings.filter { $0.0 != "lock_timeout" } + [
            ("lock_timeout", "\(min(5_000, statement / 2))ms"), ("statement_timeout", "\(statement)ms"),
        ]
    }

    /// The `application_name` of a worker's sessions: its id, cut to what Postgres keeps (63 bytes); the
    /// reaper compares the same prefix.
    public static func applicationName(of workerID: String) -> String {
        var name = ""
        for character in workerID {
            guard name.utf8.count + String(character).utf8.count <= 63, character.isASCII else { break }
            name.append(character)
        }
        return name
    }
}

/// Where a queue's claims' walk of topics stopped (``JobQueue/ClaimCursor``).
final class ClaimCursorStore: Sendable {
    private let cursor = Mutex(JobQueue.ClaimCursor())
    private let headWanted = Mutex(false)

    var value: JobQueue.ClaimCursor {
        get { self.cursor.withLock { $0 } }
        set { self.cursor.withLock { $0 = newValue } }
    }

    /// The next claim reads every range from its head: jobs went back to pending behind the resume points
    /// (released with their `run_at` kept).
    func requestHead() { self.headWanted.withLock { $0 = true } }

    /// Whether a claim asked for the head since the last call.
    func takeHeadRequest() -> Bool {
        self.headWanted.withLock { wanted in
            defer { wanted = false }
            return wanted
        }
    }
}

/// A prepared statement that failed on the server stays failed on its connection: PostgresNIO keeps the
/// error of a failed preparation and returns it for that statement name until the connection closes. One
/// Parse refused once (a lock timeout while a migration holds `push.jobs`, a cancelled statement) would
/// then fail every claim or outcome write that lands on that pooled connection. So after the first server
/// error that may come from a preparation, the queue runs its statements unnamed, as behind PgBouncer: a
/// little more planning per batch, never a connection that keeps failing.
final class PreparedStatementFailure: Sendable {
    private let failed = Atomic<Bool>(false)

    var hasFailed: Bool { self.failed.load(ordering: .relaxed) }

    /// Records `error` if the server may have refused the preparation itself; true the first time only
    /// (to log it once). Errors only the execution raises leave prepared statements on: a value or a
    /// constraint a row breaks (22, 23, 54, P0: the outcome writer's poison rows), a deadlock or a
    /// serialization failure (40), a read-only server during a failover (25). So do errors that end the
    /// connection, and its prepared state with it: a server shutting down, restarting or starting up
    /// (57P01–57P04), a connection failure (08). A Postgres restart must not leave the fleet unprepared. So
    /// does a statement stopped at its `statement_timeout` (57014): it ran, past its Parse (which waits on a
    /// lock for at most `lock_timeout`, far shorter).
    func record(_ error: any Error) -> Bool {
        guard let error = error as? PSQLError, error.code == .server else { return false }
        let state = error.serverInfo?[.sqlState] ?? ""
        let executionOrConnection = ["22", "23", "54", "P0", "40", "25", "57P0", "57014", "08"]
        if executionOrConnection.contains(where: { state.hasPrefix($0) }) { return false }
        return !self.failed.exchange(true, ordering: .relaxed)
    }
}

/// A statement the worker runs for every batch (the claim, the outcome write): named and prepared once
/// per connection when the queue may (``JobQueue/forEachRow(of:binds:_:)``), unnamed otherwise.
protocol BatchStatement {
    /// The prepared statement's name; a new name for every change of `sql`.
    static var name: String { get }
    static var sql: String { get }
}

/// A ``BatchStatement`` as PostgresNIO's prepared statement, its rows handed over as they come.
struct PreparedBatchStatement<Statement: BatchStatement>: PostgresPreparedStatement {
    typealias Row = PostgresRow
    static var name: String { Statement.name }
    static var sql: String { Statement.sql }
    let binds: PostgresBindings

    func makeBindings() throws -> PostgresBindings { self.binds }
    func decodeRow(_ row: PostgresRow) throws -> PostgresRow { row }
}

extension JobQueue {
    /// Whether the next claim or outcome write runs as a named prepared statement.
    var usesPreparedStatements: Bool { self.preparedStatements && !self.preparedStatementFailed.hasFailed }

    /// Runs `statement` with `binds`, prepared if the queue may, and hands each row to `body`, then makes sure
    /// the statement's transaction committed before returning. After a server error that may come from a
    /// preparation, statements run unnamed from then on; the error is rethrown, and the caller's retry runs
    /// unnamed.
    ///
    /// Why the commit is confirmed: PostgresNIO (extended protocol) completes a query at its CommandComplete,
    /// and Postgres commits the implicit transaction only at the Sync that follows; with synchronous replication
    /// that commit then waits for the standby. A server stopped in that wait (a planned failover stops the old
    /// primary with commits waiting) never commits them on the standby, yet the worker had its rows: it sent
    /// jobs whose claim the new primary never saw, and dropped outcomes it took for written (measured: 10-26
    /// pushes sent twice in one planned pg_auto_failover switchover in four). A second statement on the same
    /// connection is answered only after that commit (the connection starts it at ReadyForQuery), so its answer
    /// confirms the commit; its failure fails the batch, and the caller keeps the outcomes, or sends nothing.
    func forEachRow<Statement: BatchStatement>(
        of statement: Statement.Type,
        binds: PostgresBindings,
        _ body: (PostgresRow) throws -> Void
    ) async throws {
        let prepared = self.usesPreparedStatements
        try await self.client.withConnection { connection in
            do {
                if prepared {
                    let statement = PreparedBatchStatement<Statement>(binds: binds)
                    for try await row in try await connection.execute(statement, logger: self.logger) {
                        try body(row)
                    }
                } else {
                    let query = PostgresQuery(unsafeSQL: Statement.sql, binds: binds)
                    for try await row in try await connection.query(query, logger: self.logger) { try body(row) }
                }
            } catch {
                if prepared && self.preparedStatementFailed.record(error) {
                    self.logger.warning(
                        "the prepared statement \(Statement.name) failed on the server; this worker runs its statements unprepared from now on (restart it to prepare them again)",
                        metadata: ["error": "\(QueueError.summary(of: error))"]
                    )
                }
                throw error
            }
            // The commit confirmed (see above).
            for try await _ in try await connection.query(SessionSQL.confirmCommit.query(), logger: self.logger) {}
        }
    }
}

/// The statements of `Statements/session.sql`: the server session itself, whatever the table.
enum SessionSQL: StatementFile {
    static let file = "session"

    static let confirmCommit = named("confirm_commit")
    static let role = named("role")

    static let all = [confirmCommit, role]
}
