import Logging
import PostgresNIO

/// The operators' surface of the queue: controls (pauses, rate limits, cancels), dead letters (list,
/// replay, purge), inspection (a job, stats, workers), superseded rows brought back, and the console's read
/// models. The CLI's operator verbs and the console use it. The worker's surface (claim, outcomes, leases,
/// heartbeats, the reaper, and the few reads the worker needs: pauses, cancels, gauges) is ``JobQueue``.
public struct QueueOperations: Sendable {
    /// The queue whose client and logger these operations use.
    public let queue: JobQueue

    public init(_ queue: JobQueue) {
        self.queue = queue
    }

    var client: PostgresClient { self.queue.client }
    var logger: Logger { self.queue.logger }
}

extension JobQueue {
    /// This queue's operators' surface.
    public var operations: QueueOperations { QueueOperations(self) }
}
