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

/// What a fan-out did: to each parent, and the children it claimed for the worker at once.
public struct FanOutBatch: Sendable {
    public var parents: [FanOut]
    /// Children inserted `running`, held by the worker as attempt 1 as if it had claimed them: to be sent
    /// now, their outcomes written like any claimed job's.
    public var claimed: [PushJob]
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
        try await self.fanOut(jobs, workerID: workerID, claimingUpTo: 0, lease: .seconds(60)).parents
    }

    /// Fans out as ``fanOut(_:workerID:)`` does, and claims up to `limit` of the children for `workerID`
    /// (leased for `lease`) in the same transaction, saving each a claim: only children nothing the claim
    /// applies could hold back (their parent has no `coalesce_key`; no pause or rate limit matches its
    /// credential and topic; `excluding` leaves none of them out). The rest are `pending`, for any worker's
    /// claim.
    public func fanOut(
        _ jobs: [PushJob],
        workerID: String,
        claimingUpTo limit: Int,
        lease: Duration,
        excluding: ClaimExclusions = ClaimExclusions()
    ) async throws -> FanOutBatch {
        guard !jobs.isEmpty else { return FanOutBatch(parents: [], claimed: []) }
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
                    $0.bind("claim_limit", Int32(clamping: max(limit, 0)))
                    $0.bind("lease_seconds", lease.seconds)
                    $0.bind("excluded_environments", excluding.environments)
                    $0.bind("excluded_pairs", excluding.endpoints.map(\.description))
                    $0.bind("excluded_topics", excluding.topics.map(\.description))
                },
                logger: logger
            )
            var parents: [FanOut] = []
            for try await (id, state, children) in rows.decode((Int64, String, [Int64]).self) {
                parents.append(FanOut(parentID: id, state: state, children: children))
            }
            guard limit > 0 else { return FanOutBatch(parents: parents, claimed: []) }
            let children = parents.flatMap(\.children)
            guard !children.isEmpty else { return FanOutBatch(parents: parents, claimed: []) }
            var claimed: [PushJob] = []
            let claimedRows = try await connection.query(
                JobsSQL.claimedChildren.query {
                    $0.bind("ids", children)
                    $0.bind("worker_id", workerID)
                },
                logger: logger
            )
            for try await row in claimedRows { claimed.append(try Self.decodeJob(row)) }
            return FanOutBatch(parents: parents, claimed: claimed)
        }
    }
}
