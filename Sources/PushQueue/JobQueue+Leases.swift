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
            """
            UPDATE push.jobs AS j
               SET state = 'pending', attempts = j.attempts - 1, locked_by = NULL, locked_until = NULL
              FROM unnest(\(ids)::bigint[], \(attempts)::smallint[]) AS i(id, attempt)
             WHERE j.id = i.id AND j.attempts = i.attempt AND j.locked_by = \(workerID)
            RETURNING j.id
            """,
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
            """
            UPDATE push.jobs SET locked_until = now() + make_interval(secs => \(seconds))
             WHERE id IN (SELECT id FROM push.jobs WHERE id = ANY (\(ids.sorted())::bigint[]) AND locked_by = \(workerID)
                           ORDER BY id FOR NO KEY UPDATE SKIP LOCKED)
               AND locked_by = \(workerID)
            RETURNING id
            """,
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
            """
            WITH delivered AS (
                SELECT id FROM push.jobs
                 WHERE state = 'delivered' AND delivered_at < now() - make_interval(secs => \(seconds))
                 LIMIT \(Int64(batchSize))
                 FOR UPDATE SKIP LOCKED
            ), superseded AS (
                -- Superseded jobs (never sent) go by the same retention, counted from their creation.
                SELECT id FROM push.jobs
                 WHERE state = 'superseded' AND created_at < now() - make_interval(secs => \(seconds))
                 LIMIT \(Int64(batchSize))
                 FOR UPDATE SKIP LOCKED
            ), cancelled AS (
                -- Cancelled jobs too (a holder's late outcome is no longer awaited after the retention).
                SELECT id FROM push.jobs
                 WHERE state = 'cancelled' AND created_at < now() - make_interval(secs => \(seconds))
                 LIMIT \(Int64(batchSize))
                 FOR UPDATE SKIP LOCKED
            )
            -- The apns_id stays spent in push.apns_ids: an outbox retry of this job is skipped, not sent again.
            DELETE FROM push.jobs
             WHERE id IN (SELECT id FROM delivered UNION ALL SELECT id FROM superseded
                          UNION ALL SELECT id FROM cancelled)
            RETURNING id
            """
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
        let forgotten = try await self.deleteInBatches(
            of: batchSize,
            """
            DELETE FROM push.apns_ids WHERE apns_id IN (
                SELECT a.apns_id FROM push.apns_ids AS a
                 WHERE a.created_at < now() - make_interval(secs => \(seconds))
                   AND NOT EXISTS (SELECT 1 FROM push.jobs AS j WHERE j.apns_id = a.apns_id)
                   AND NOT EXISTS (SELECT 1 FROM push.dead_jobs AS d WHERE d.apns_id = a.apns_id)
                 LIMIT \(Int64(batchSize)) FOR UPDATE SKIP LOCKED)
            RETURNING 1
            """
        )
        _ = try await self.deleteInBatches(
            of: batchSize,
            """
            DELETE FROM push.retired_apns_ids WHERE apns_id IN (
                SELECT apns_id FROM push.retired_apns_ids
                 WHERE retired_at < now() - make_interval(secs => \(seconds))
                 LIMIT \(Int64(batchSize)) FOR UPDATE SKIP LOCKED)
            RETURNING 1
            """
        )
        _ = try await self.deleteInBatches(
            of: batchSize,
            PostgresQuery(unsafeSQL: Self.coalesceMarksPruneSQL(ageSeconds: seconds, batchSize: batchSize))
        )
        return forgotten
    }

    /// The latest-wins marks of keys not claimed for `ageSeconds`, read through `coalesce_marks_updated_idx`
    /// (schema 14): only the marks it deletes.
    static func coalesceMarksPruneSQL(ageSeconds: Double, batchSize: Int) -> String {
        """
        DELETE FROM push.coalesce_marks WHERE (topic, environment, coalesce_key) IN (
            SELECT topic, environment, coalesce_key FROM push.coalesce_marks
             WHERE updated_at < now() - make_interval(secs => \(ageSeconds))
             LIMIT \(batchSize) FOR UPDATE SKIP LOCKED)
        RETURNING 1
        """
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
