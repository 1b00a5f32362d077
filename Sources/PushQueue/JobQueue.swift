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
    /// Whether the claim and the outcome write run as named prepared statements (planned once per connection).
    let preparedStatements: Bool

    /// - Parameters:
    ///   - client: a client whose `run()` the caller drives.
    ///   - logger: where the queue logs; job ids and apns ids only, never tokens or payloads.
    ///   - preparedStatements: run the claim and the outcome write as named prepared statements: planning
    ///     them took 1–1.6 ms per batch. Off behind PgBouncer's transaction pooling, which loses named statements (the
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
    ///
    /// `plan_cache_mode = force_generic_plan`: the claim and the outcome write are named prepared
    /// statements, and a generic plan is the one Postgres keeps. Left to choose, it re-plans the claim on
    /// every call (1.6 ms, 16 µs per job during a drain): its estimate for the generic plan is twenty times
    /// the custom one's, while both run the same index scans in the same time. The worker's other
    /// statements are keyed by ids and run on indexes whatever their parameters.
    public static let workerSessionSettings: [(String, String)] = [
        ("enable_seqscan", "off"), ("jit", "off"), ("plan_cache_mode", "force_generic_plan"),
    ]
}
