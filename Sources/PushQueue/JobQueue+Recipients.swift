import PostgresNIO
public import PushCore

/// What a fan-out did to one recipient's job.
public struct FanOut: Sendable, Hashable {
    public var parentID: Int64
    /// `fanned_out` (its children exist), `superseded` (a newer job of its key) or `dead` (NoDevice).
    public var state: String
    /// The children's ids, one per live device token (empty unless `fanned_out`).
    public var children: [Int64]
}

extension JobQueue {
    /// A dead recipient's job's `error`: `format()` fills in the recipient, topic and platform.
    static let noDeviceSentence =
        "recipient '%s' has no live device for topic '%s' on %s in push.devices: register the app's token there (kind device), or upsert it again if a provider called it invalid, then replay this job."

    /// Fans out recipients' jobs this worker claimed (``PushJob/recipient``): one child job per live device
    /// token of the recipient for the job's topic and platform, the parent `fanned_out`; one with no live
    /// device a dead letter (NoDevice); one whose key has a newer recipient's job superseded. One statement,
    /// fenced like an outcome: a worker that dies before it commits leaves the parents to be claimed again, and
    /// a parent cancelled or taken back meanwhile is left alone (it is not in the result).
    public func fanOut(_ jobs: [PushJob], workerID: String) async throws -> [FanOut] {
        guard !jobs.isEmpty else { return [] }
        let logger = self.logger
        let ids = jobs.map(\.id)
        let attempts = jobs.map { Int16(clamping: $0.attempts) }
        return try await self.client.withTransaction(logger: logger) { connection in
            // The children are the worker's own insert: their derived apns_id passes the producers' trigger.
            try await connection.query(JobsSQL.markInternalInsert.query(), logger: logger)
            let rows = try await connection.query(
                JobsSQL.fanOut.query {
                    $0.bind("ids", ids)
                    $0.bind("attempts", attempts)
                    $0.bind("worker_id", workerID)
                    $0.bind("no_device_sentence", Self.noDeviceSentence)
                },
                logger: logger
            )
            var results: [FanOut] = []
            for try await (id, state, children) in rows.decode((Int64, String, [Int64]).self) {
                results.append(FanOut(parentID: id, state: state, children: children))
            }
            return results
        }
    }
}
