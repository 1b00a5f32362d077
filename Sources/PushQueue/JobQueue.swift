public import Logging
public import PostgresNIO

/// The queue's operations on `push.jobs`, `push.dead_jobs` and `push.invalid_tokens`.
///
/// Each operation is one SQL round trip (a few for dead-letter moves of many rows), built for batches:
/// the worker claims as many jobs as it can send and writes their outcomes back together. Every write of
/// an outcome is fenced on (id, attempt, worker), so a worker whose lease was lost cannot overwrite the
/// newer attempt of another.
public struct JobQueue: Sendable {
    /// The client every operation runs on; the caller runs it.
    public let client: PostgresClient
    let logger: Logger
    /// Whether the outcome write runs as a named prepared statement (planned once per connection).
    let preparedStatements: Bool

    /// - Parameters:
    ///   - client: a client whose `run()` the caller drives.
    ///   - logger: where the queue logs; job ids and apns ids only, never tokens or payloads.
    ///   - preparedStatements: run the outcome write as a named prepared statement: planning it took
    ///     ~1 ms per batch. Off behind PgBouncer's transaction pooling, which loses named statements (the
    ///     worker turns it off with `--no-session-settings`).
    public init(client: PostgresClient, logger: Logger, preparedStatements: Bool = false) {
        self.client = client
        self.logger = logger
        self.preparedStatements = preparedStatements
    }
}

extension JobQueue {
    /// Session settings for the worker's connections (`additionalStartupParameters`). Every query the worker
    /// runs is written for an index; a queue table swings from millions of rows to a few, and after a
    /// drain its heap stays large while its statistics say "small": the planner then prefers a sequential
    /// scan of the empty pages (measured: 226 ms instead of 1.3 ms for a claim after draining 800,000
    /// jobs) and JIT-compiles the claim (+300 ms). Neither ever pays off here.
    public static let workerSessionSettings: [(String, String)] = [("enable_seqscan", "off"), ("jit", "off")]
}
