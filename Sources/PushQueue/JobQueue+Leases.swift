import PostgresNIO

extension JobQueue {
    /// Returns jobs this worker claimed but never sent to `pending`, as if never claimed: the attempt is
    /// not counted and `run_at` is kept. Used on shutdown. Fenced like an outcome write.
    ///
    /// - Returns: how many jobs were released.
    @discardableResult
    public func release(_ jobs: [(id: Int64, attempt: Int)], workerID: String) async throws -> Int {
        guard !jobs.isEmpty else { return 0 }
        // They keep their run_at: this queue's next claim reads from the ranges' heads, where they are.
        defer { self.claimCursor.requestHead() }
        let ids = jobs.map(\.id)
        let attempts = jobs.map { Int16(clamping: $0.attempt) }
        var count = 0
        for try await _ in try await self.client.query(
            JobsSQL.release.query {
                $0.bind("ids", ids)
                $0.bind("attempts", attempts)
                $0.bind("worker_id", workerID)
            },
            logger: self.logger
        ) {
            count += 1
        }
        return count
    }

    /// Extends the lease of jobs this worker still holds (for sends that wait on a paused connection).
    /// A row another statement holds right now is skipped (its lease is extended on the next beat), so a
    /// heartbeat never waits behind an operator's or a producer's lock.
    ///
    /// - Returns: how many leases were extended.
    @discardableResult
    public func extendLeases(_ ids: [Int64], workerID: String, lease: Duration) async throws -> Int {
        guard !ids.isEmpty else { return 0 }
        let seconds = Double(lease.components.seconds) + Double(lease.components.attoseconds) / 1e18
        var count = 0
        for try await _ in try await self.client.query(
            JobsSQL.extendLeases.query {
                $0.bind("ids", ids.sorted())
                $0.bind("worker_id", workerID)
                $0.bind("lease_seconds", seconds)
            },
            logger: self.logger
        ) {
            count += 1
        }
        return count
    }

    /// Deletes delivered (and superseded) jobs older than `retention`, at most `batchSize` rows per statement, until none
    /// are left, so no statement holds many locks or a long transaction.
    ///
    /// - Returns: how many rows were deleted.
    @discardableResult
    public func pruneDelivered(olderThan retention: Duration, batchSize: Int = 5_000) async throws -> Int {
        let seconds = Double(retention.components.seconds)
        return try await self.deleteInBatches(
            of: batchSize,
            JobsSQL.pruneFinished.query {
                $0.bind("retention_seconds", seconds)
                $0.bind("batch_size", Int64(batchSize))
            }
        )
    }

    /// Forgets the apns_ids enqueued more than `age` ago that no job and no dead letter holds any longer
    /// (`push.apns_ids`, and `push.retired_apns_ids` of schema 4 to 7): an INSERT reusing one is then a new
    /// job. Keep `age` longer than any producer retries an enqueue. Also forgets the latest-wins marks of
    /// keys not claimed for `age`.
    ///
    /// - Returns: how many apns_ids were forgotten.
    @discardableResult
    public func forgetRetiredAPNsIDs(olderThan age: Duration, batchSize: Int = 5_000) async throws -> Int {
        let seconds = Double(age.components.seconds)
        func aged(_ statement: SQLStatement) -> PostgresQuery {
            statement.query {
                $0.bind("age_seconds", seconds)
                $0.bind("batch_size", Int64(batchSize))
            }
        }
        let forgotten = try await self.deleteInBatches(of: batchSize, aged(JobsSQL.forgetAPNsIDs))
        _ = try await self.deleteInBatches(of: batchSize, aged(JobsSQL.forgetRetiredAPNsIDs))
        _ = try await self.deleteInBatches(of: batchSize, aged(JobsSQL.forgetCoalesceMarks))
        return forgotten
    }

    /// Runs `statement` (a DELETE of at most `batchSize` rows, `SKIP LOCKED`, returning one row per row
    /// deleted) until a run deletes fewer: no statement holds many locks, and workers pruning at the same
    /// moment share the work. Returns how many rows were deleted in all.
    func deleteInBatches(of batchSize: Int, _ statement: PostgresQuery) async throws -> Int {
        var total = 0
        while true {
            var deleted = 0
            for try await _ in try await self.client.query(statement, logger: self.logger) { deleted += 1 }
            total += deleted
            if deleted < batchSize { return total }
        }
    }
}

/// The statements of `Statements/jobs.sql`, with their binds in order.
enum JobsSQL: StatementFile {
    static let file = "jobs"

    static let supersedeClaimed = named("supersede_claimed", "ids", "attempts", "by", "worker_id")
    static let untilNextDue = named("until_next_due")
    static let release = named("release", "ids", "attempts", "worker_id")
    static let extendLeases = named("extend_leases", "ids", "worker_id", "lease_seconds")
    static let pruneFinished = named("prune_finished", "retention_seconds", "batch_size")
    static let forgetAPNsIDs = named("forget_apns_ids", "age_seconds", "batch_size")
    static let forgetRetiredAPNsIDs = named("forget_retired_apns_ids", "age_seconds", "batch_size")
    static let forgetCoalesceMarks = named("forget_coalesce_marks", "age_seconds", "batch_size")
    static let show = named("show", "id")
    static let children = named("children", "id")
    static let stats = named("stats")
    static let gauges = named("gauges", "stale_seconds", "worker_id")
    static let overview = named("overview", "cap")
    static let outcomesByMinute = named("outcomes_by_minute", "minutes")
    static let writeUnwritable = named(
        "write_unwritable",
        "delivered",
        "id",
        "attempt",
        "worker_id",
        "status",
        "reason",
        "sentence",
        "entry"
    )

    static let markInternalInsert = named("mark_internal_insert")
    static let lockSuperseded = named("lock_superseded", "ids")
    static let assessRevive = named("assess_revive", "ids")
    static let revive = named("revive", "ids")
    static let fanOut = named(
        "fan_out",
        "ids",
        "attempts",
        "worker_id",
        "no_device_sentence",
        "claim_limit",
        "lease_seconds",
        "excluded_environments",
        "excluded_pairs",
        "excluded_topics"
    )
    static let claimedChildren = named("claimed_children", "ids", "worker_id")

    static let all = [
        supersedeClaimed, untilNextDue, release, extendLeases, pruneFinished, forgetAPNsIDs, forgetRetiredAPNsIDs,
        forgetCoalesceMarks, show, children, stats, gauges, overview, outcomesByMinute, writeUnwritable,
        markInternalInsert,
        lockSuperseded, assessRevive, revive, fanOut, claimedChildren,
    ]
}
