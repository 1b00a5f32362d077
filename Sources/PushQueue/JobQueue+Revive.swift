public import Foundation
import PostgresNIO

/// What ``JobQueue/reviveSuperseded(ids:dryRun:)`` did with each job asked for.
public struct ReviveResult: Sendable, Hashable {
    /// A superseded job sent again: queued under a new id, above its key's high-water mark.
    public struct Revived: Sendable, Hashable {
        /// The superseded job's id (its row is gone: the job lives on under `newID`).
        public var id: Int64
        /// The id it is queued under now (for a dry run, `nil`).
        public var newID: Int64?
        /// The `apns_id` it keeps (it was never sent).
        public var apnsID: UUID
        /// The dead letter that had superseded it and died unsent.
        public var deadSuperseder: Int64
        /// Its `expires_at` has passed: it will die `Expired` at once.
        public var expired: Bool
    }

    /// A job left as it is, and why.
    public struct Refused: Sendable, Hashable {
        /// The job's id.
        public var id: Int64
        /// A sentence for the operator: what holds it and what to do instead.
        public var why: String
    }

    /// The jobs queued again (or, for a dry run, that would be).
    public var revived: [Revived]
    /// The jobs left as they are.
    public var refused: [Refused]
    /// Whether this was a dry run.
    public var dryRun: Bool
}

extension QueueOperations {
    /// Queues superseded jobs again whose key's newest claimed job died unsent (it is a dead letter, so the
    /// device never got the newer state): "latest wins" then means the newest state that can still arrive.
    ///
    /// A revived job gets a new id above its key's high-water mark, keeps its `apns_id` (never sent) and its
    /// history plus a `revived` entry naming its old id; it is `pending`, due now, attempts reset. A job is
    /// refused when a newer job of its key is pending, running or delivered (it would send an older state
    /// after a newer one), when the job that superseded it is no longer kept (retention: whether it was
    /// delivered is unknown), or when it is not superseded. Two jobs of one key revived together keep their
    /// order: the newer supersedes the older at its claim.
    public func reviveSuperseded(ids: [Int64], dryRun: Bool) async throws -> ReviveResult {
        guard !ids.isEmpty else { return ReviveResult(revived: [], refused: [], dryRun: dryRun) }
        let logger = self.logger
        return try await self.client.withTransaction(logger: logger) { connection in
            // The asked-for rows are locked first (a worker's claim skips them), then assessed.
            _ = try await connection.query(JobsSQL.lockSuperseded.query { $0.bind("ids", ids) }, logger: logger)
                .collect()
            var revivable: [(Int64, UUID, Int64, Bool)] = []
            var refused: [ReviveResult.Refused] = []
            let rows = try await connection.query(JobsSQL.assessRevive.query { $0.bind("ids", ids) }, logger: logger)
            for try await (id, state, apnsID, expired, newest, newestDead, blocker, blockerState) in rows.decode(
                (Int64, String?, UUID?, Bool?, Int64?, Bool, Int64?, String?).self
            ) {
                guard let state, let apnsID else {
                    refused.append(.init(id: id, why: "no job \(id) in push.jobs"))
                    continue
                }
                guard state == "superseded" else {
                    refused.append(.init(id: id, why: "job \(id) is \(state), not superseded: nothing to revive"))
                    continue
                }
                if let blocker, let blockerState {
                    refused.append(
                        .init(
                            id: id,
                            why:
                                "job \(id): a newer job of its coalesce_key, \(blocker), is \(blockerState); reviving would send an older state after it"
                        )
                    )
                    continue
                }
                guard let newest, newestDead else {
                    refused.append(
                        .init(
                            id: id,
                            why:
                                "job \(id): the job that superseded it (\(newest.map(String.init) ?? "unknown")) is no longer kept, so whether it was delivered is unknown; enqueue the state again as a new job if it is still wanted"
                        )
                    )
                    continue
                }
                revivable.append((id, apnsID, newest, expired ?? false))
            }
            guard !dryRun, !revivable.isEmpty else {
                return ReviveResult(
                    revived: revivable.map {
                        .init(id: $0.0, newID: nil, apnsID: $0.1, deadSuperseder: $0.2, expired: $0.3)
                    },
                    refused: refused.sorted { $0.id < $1.id },
                    dryRun: dryRun
                )
            }
            // The worker's own insert (the INSERT trigger keeps the row's columns).
            try await connection.query(JobsSQL.markInternalInsert.query(), logger: logger)
            var newIDs: [Int64: Int64] = [:]
            for try await (old, new) in try await connection.query(
                JobsSQL.revive.query { $0.bind("ids", revivable.map(\.0)) },
                logger: logger
            ).decode((Int64, Int64).self) {
                newIDs[old] = new
            }
            return ReviveResult(
                revived: revivable.compactMap { job in
                    newIDs[job.0].map {
                        .init(id: job.0, newID: $0, apnsID: job.1, deadSuperseder: job.2, expired: job.3)
                    }
                },
                refused: refused.sorted { $0.id < $1.id },
                dryRun: false
            )
        }
    }
}
