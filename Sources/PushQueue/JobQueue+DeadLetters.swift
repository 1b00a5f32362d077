import Foundation
import PostgresNIO
import PushCore

extension QueueOperations {
    /// Dead letters matching `filter`, newest first.
    public func deadLetters(matching filter: DeadLetterFilter) async throws -> [DeadLetter] {
        let query = DeadJobsSQL.list.query {
            $0.bind(filter)
            $0.bind("limit", Int64(max(filter.limit, 0)))
        }
        var letters: [DeadLetter] = []
        for try await row in try await self.client.query(query, logger: self.logger) {
            letters.append(try Self.decodeDeadLetter(row))
        }
        return letters
    }

    /// One dead letter by id, or `nil`.
    public func deadLetter(id: Int64) async throws -> DeadLetter? {
        try await self.deadLetters(matching: DeadLetterFilter(ids: [id], limit: 1)).first
    }

    /// Moves matching dead letters back to `push.jobs` as `pending`, due now, with attempts, status,
    /// reason and trap ids reset, the history kept (plus a `replayed` entry) and the same `apns_id`
    /// unless `newAPNsID`. With `dryRun` nothing moves and the result lists what would.
    ///
    /// A dead letter whose id or `apns_id` is already in `push.jobs` is skipped, never dropped.
    /// - Parameter expiresIn: a new `expires_at`, this long from now, for every replayed job (a job whose
    ///   `expires_at` has passed would otherwise die `Expired` again at once).
    public func replay(
        matching filter: DeadLetterFilter,
        newAPNsID: Bool = false,
        expiresIn: Duration? = nil,
        dryRun: Bool = false
    ) async throws -> ReplayResult {
        let query = (dryRun ? DeadJobsSQL.replayPreview : DeadJobsSQL.replay).query {
            $0.bind(filter)
            $0.bind("limit", Int64(max(filter.limit, 0)))
            $0.bind("new_apns_id", newAPNsID)
            $0.bind("expires_in_seconds", expiresIn.map { Double($0.components.seconds) })
        }
        let logger = self.logger
        // The producers' INSERT trigger skips an apns_id held by a dead letter and resets the worker's
        // columns; a replay is the worker's own insert, marked for its transaction.
        let results = try await self.client.withTransaction(logger: logger) { connection in
            if !dryRun {
                try await connection.query(JobsSQL.markInternalInsert.query(), logger: logger)
            }
            var results: [(Int64, UUID?, String?, Bool, Bool?, String?, Int64?, Bool)] = []
            for try await row in try await connection.query(query, logger: logger)
                .decode((Int64, UUID?, String?, Bool, Bool?, String?, Int64?, Bool).self)
            {
                results.append(row)
            }
            return results
        }
        var moved: [ReplayResult.Moved] = []
        var skipped: [Int64] = []
        var invalid: [ReplayResult.Invalid] = []
        for (id, apnsID, reason, conflicted, expired, broken, queuedAs, renumbered) in results {
            if let broken {
                invalid.append(.init(id: id, rule: broken))
            } else if conflicted {
                skipped.append(id)
            } else if let apnsID {
                moved.append(
                    .init(
                        id: id,
                        apnsID: apnsID,
                        reason: reason ?? "",
                        expired: expired ?? false,
                        queuedAs: queuedAs,
                        renumbered: renumbered
                    )
                )
            }
        }
        return ReplayResult(
            moved: moved.sorted { $0.id < $1.id },
            skippedInvalid: invalid.sorted { $0.id < $1.id },
            skippedConflicts: skipped.sorted(),
            dryRun: dryRun
        )
    }

    /// Deletes dead letters that died more than `age` ago, in bounded batches.
    ///
    /// - Returns: how many were deleted.
    @discardableResult
    public func purgeDeadLetters(olderThan age: Duration, batchSize: Int = 5_000) async throws -> Int {
        let seconds = Double(age.components.seconds)
        return try await self.queue.deleteInBatches(
            of: batchSize,
            DeadJobsSQL.purgeOlder.query {
                $0.bind("age_seconds", seconds)
                $0.bind("batch_size", Int64(batchSize))
            }
        )
    }

    /// Deletes the dead letters that died before `cutoffMicros` (microseconds since 1970, exact), in bounded
    /// batches: a purge confirmed from a preview deletes what the preview counted, however long it was open.
    ///
    /// - Returns: how many were deleted.
    @discardableResult
    public func purgeDeadLetters(diedBeforeMicros cutoffMicros: Int64, batchSize: Int = 5_000) async throws -> Int {
        try await self.queue.deleteInBatches(
            of: batchSize,
            DeadJobsSQL.purgeDiedBefore.query {
                $0.bind("cutoff_micros", cutoffMicros)
                $0.bind("batch_size", Int64(batchSize))
            }
        )
    }

    static func decodeDeadLetter(_ row: PostgresRow) throws -> DeadLetter {
        let job = try JobQueue.decodeJob(row)
        let cells = row.makeRandomAccess()
        return DeadLetter(
            job: job,
            status: try cells["status"].decode(Int16?.self).map(Int.init),
            reason: try cells["reason"].decode(String.self),
            apnsUniqueID: try cells["apns_unique_id"].decode(String?.self),
            deadAt: try cells["dead_at"].decode(Date.self),
            error: try cells["error"].decode(String.self),
            historyJSON: try cells["history_json"].decode(String.self),
            rowJSON: try cells["row_json"].decode(String.self)
        )
    }
}

/// The statements of `Statements/dead_jobs.sql`, with their binds in order.
enum DeadJobsSQL: StatementFile {
    static let file = "dead_jobs"

    /// The binds of `dead_letter_filter.sql`, in the order every statement that includes it declares them
    /// first.
    static let filter = [
        "ids", "trap_id", "no_trap", "last_trap", "reason", "topic", "since", "before",
    ]
    private static func filtered(_ name: String, _ binds: String...) -> SQLStatement {
        SQLStatement(file: Self.file, name: name, binds: Self.filter + binds)
    }

    static let purgeOlder = named("purge_older", "age_seconds", "batch_size")
    static let purgeDiedBefore = named("purge_died_before", "cutoff_micros", "batch_size")
    static let list = filtered("list", "limit")
    static let page = filtered("page", "cursor_micros", "cursor_id", "limit")
    static let groups = filtered("groups", "cap")
    static let replayPreview = filtered("replay_preview", "limit", "new_apns_id", "expires_in_seconds")
    static let replay = filtered("replay", "limit", "new_apns_id", "expires_in_seconds")

    static let all = [purgeOlder, purgeDiedBefore, list, page, groups, replayPreview, replay]
}

extension NamedBindings {
    /// Binds `filter` as the conditions of `dead_letter_filter.sql` (each NULL, or false, when not given).
    mutating func bind(_ filter: DeadLetterFilter) {
        self.bind("ids", filter.ids.isEmpty ? nil : filter.ids)
        self.bind("trap_id", filter.trapID)
        self.bind("no_trap", filter.lastTrap == .some(nil))
        self.bind("last_trap", filter.lastTrap ?? nil)
        self.bind("reason", filter.reason)
        self.bind("topic", filter.topic)
        self.bind("since", filter.since)
        self.bind("before", filter.before)
    }
}
