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

    /// - Parameters:
    ///   - client: a client whose `run()` the caller drives.
    ///   - logger: where the queue logs; job ids and apns ids only, never tokens or payloads.
    public init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }
}
