public import Foundation
import PostgresNIO

/// A fleet-wide pause: jobs matching it are not claimed (`push.pauses`).
public struct Pause: Sendable, Hashable, Codable {
    /// The credential it pauses, or `nil` for every credential.
    public var credential: String?
    /// The topic it pauses, or `nil` for every topic.
    public var topic: String?
    /// Why, as the operator wrote it.
    public var reason: String
    /// When it was made.
    public var createdAt: Date
    /// The database role that made it.
    public var createdBy: String
    /// Pending jobs it holds now (counted only by ``JobQueue/pauses(countingJobs:)``).
    public var pendingJobs: Int?

    /// `credential=C topic=T`, with `*` for any.
    public var scope: String { "credential=\(self.credential ?? "*") topic=\(self.topic ?? "*")" }
}

/// A fleet-wide rate limit (`push.rate_limits`): a send schedule the claim fills, one interval per job.
public struct RateLimit: Sendable, Hashable, Codable {
    /// The credential it limits, or `nil` for every credential.
    public var credential: String?
    /// The topic it limits, or `nil` for every topic.
    public var topic: String?
    /// The average rate.
    public var perSecond: Double
    /// The most claimed ahead of their send times.
    public var burst: Int
    /// How many matching jobs a claim could take now (0 while the schedule is `burst` intervals ahead).
    public var available: Int

    /// `credential=C topic=T`, with `*` for any.
    public var scope: String { "credential=\(self.credential ?? "*") topic=\(self.topic ?? "*")" }
}

extension QueueOperations {
    /// Pauses claiming of the jobs matching `credential` and `topic` (`nil`: any) across the fleet; a pause of
    /// the same scope is replaced (its reason updated). Every worker stops claiming them at its next claim.
    @discardableResult
    public func pause(credential: String?, topic: String?, reason: String) async throws -> Pause {
        let rows = try await self.client.query(
            """
            INSERT INTO push.pauses (credential, topic, reason) VALUES (\(credential), \(topic), \(reason))
            ON CONFLICT ON CONSTRAINT one_pause_per_credential_and_topic
            DO UPDATE SET reason = excluded.reason, created_at = now(), created_by = current_user
            RETURNING credential, topic, reason, created_at, created_by
            """,
            logger: self.logger
        )
        for try await (credential, topic, reason, at, by) in rows.decode((String?, String?, String, Date, String).self)
        {
            return Pause(credential: credential, topic: topic, reason: reason, createdAt: at, createdBy: by)
        }
        throw QueueError(code: .invalidArgument, message: "the pause was not recorded")
    }

    /// Lifts the pause of exactly this scope and wakes every listening worker (NOTIFY), so its jobs are
    /// claimed at once. Returns whether there was one.
    public func resume(credential: String?, topic: String?) async throws -> Bool {
        try await self.deleteScope(from: "push.pauses", credential: credential, topic: topic)
    }

    /// NOTIFY on the channel every worker listens on: they claim at once instead of at their next poll.
    func wakeWorkers() async throws {
        try await self.client.query("NOTIFY push_jobs", logger: self.logger)
    }

    /// Sets the rate limit of this scope (replacing one there), with a full bucket, and wakes the workers.
    @discardableResult
    public func setRateLimit(
        credential: String?,
        topic: String?,
        perSecond: Double,
        burst: Int
    ) async throws
        -> RateLimit
    {
        let rows = try await self.client.query(
            """
            INSERT INTO push.rate_limits (credential, topic, per_second, burst)
            VALUES (\(credential), \(topic), \(perSecond)::float8::numeric, \(Int32(clamping: burst)))
            ON CONFLICT ON CONSTRAINT one_limit_per_credential_and_topic
            DO UPDATE SET per_second = excluded.per_second, burst = excluded.burst, created_at = now(),
                          created_by = current_user
            RETURNING credential, topic, per_second::float8, burst, \(unescaped: Self.availableNow)
            """,
            logger: self.logger
        )
        for try await (credential, topic, rate, burst, available) in rows.decode(
            (String?, String?, Double, Int32, Int64).self
        ) {
            try await self.wakeWorkers()
            return RateLimit(
                credential: credential,
                topic: topic,
                perSecond: rate,
                burst: Int(burst),
                available: Int(available)
            )
        }
        throw QueueError(code: .invalidArgument, message: "the rate limit was not recorded")
    }

    /// Removes the rate limit of exactly this scope and wakes the workers. Returns whether there was one.
    public func clearRateLimit(credential: String?, topic: String?) async throws -> Bool {
        try await self.deleteScope(from: "push.rate_limits", credential: credential, topic: topic)
    }

    /// Deletes the row of exactly this scope from `push.pauses` or `push.rate_limits`, then wakes the
    /// workers (NOTIFY). Returns whether there was one.
    private func deleteScope(from table: String, credential: String?, topic: String?) async throws -> Bool {
        let rows = try await self.client.query(
            """
            DELETE FROM \(unescaped: table)
             WHERE credential IS NOT DISTINCT FROM \(credential) AND topic IS NOT DISTINCT FROM \(topic)
            RETURNING 1
            """,
            logger: self.logger
        )
        var found = false
        for try await _ in rows { found = true }
        try await self.wakeWorkers()
        return found
    }

    /// How many jobs a claim could take now under a `push.rate_limits` row: the claim's own expression
    /// (``JobQueue.available(perSecond:burst:delay:halfLease:)``) with the default lease's look-ahead (30 s), read only.
    static let availableNow =
        "greatest("
        + JobQueue.available(
            perSecond: "per_second::float8",
            burst: "burst::float8",
            delay: "greatest(extract(epoch FROM next_send_at - clock_timestamp()), 0)",
            halfLease: "30"
        ) + ", 0)::bigint"

    /// Every rate limit with what a claim could take under it now (read only: nothing is scheduled).
    public func rateLimits() async throws -> [RateLimit] {
        let rows = try await self.client.query(
            """
            SELECT credential, topic, per_second::float8, burst, \(unescaped: Self.availableNow)
              FROM push.rate_limits ORDER BY credential NULLS FIRST, topic NULLS FIRST
            """,
            logger: self.logger
        )
        var limits: [RateLimit] = []
        for try await (credential, topic, rate, burst, available) in rows.decode(
            (String?, String?, Double, Int32, Int64).self
        ) {
            limits.append(
                RateLimit(
                    credential: credential,
                    topic: topic,
                    perSecond: rate,
                    burst: Int(burst),
                    available: Int(available)
                )
            )
        }
        return limits
    }
}

/// What ``JobQueue/cancel(ids:coalesceKey:topic:)`` did.
public struct CancelResult: Sendable, Hashable, Codable {
    /// Jobs now `cancelled` that were waiting (`pending`): never sent.
    public var cancelled: [Int64]
    /// Jobs now `cancelled` that a worker held: it withdraws each whose request is not yet written; one
    /// already in flight completes and its outcome is recorded.
    public var heldByWorkers: [Int64]
    /// Asked-for jobs that had already ended (delivered, superseded, cancelled) or are dead letters, with
    /// their state, left as they are.
    public var ended: [String: String]
    /// Asked-for ids found nowhere.
    public var missing: [Int64]
}

extension JobQueue {
    /// The NOTIFY payload prefix that tells workers which held jobs were cancelled.
    public static let cancelNotificationPrefix = "cancel:"

    /// Which of `ids` (jobs a worker holds) an operator cancelled: each heartbeat asks, so a cancel whose
    /// NOTIFY was missed (the LISTEN connection reconnecting, a pooler) still reaches the worker.
    public func cancelled(among ids: [Int64]) async throws -> [Int64] {
        guard !ids.isEmpty else { return [] }
        var found: [Int64] = []
        for try await id in try await self.client.query(
            "SELECT id FROM push.jobs WHERE id = ANY (\(ids)::bigint[]) AND state = 'cancelled'",
            logger: self.logger
        ).decode(Int64.self) {
            found.append(id)
        }
        return found
    }

    /// Cancels queued or retrying jobs, by id or by `coalesce_key` (within `topic`, if given): they end
    /// `cancelled` and are never sent. Jobs a worker holds are cancelled too, and every worker is told
    /// (NOTIFY) so it withdraws those whose request is not yet written.
    public func cancel(ids: [Int64], coalesceKey: String? = nil, topic: String? = nil) async throws -> CancelResult {
        var binds = PostgresBindings()
        binds.append(ids)
        binds.append(coalesceKey)
        binds.append(topic)
        let sql = """
            WITH targets AS (
                SELECT j.id, j.state FROM push.jobs AS j
                 WHERE (j.id = ANY ($1::bigint[])
                        OR ($2::text IS NOT NULL AND j.coalesce_key = $2 AND ($3::text IS NULL OR j.topic = $3)))
                   AND j.state IN ('pending', 'running')
                 FOR NO KEY UPDATE
            ), cancelled AS (
                UPDATE push.jobs AS j
                   SET state = 'cancelled', reason = 'Cancelled', locked_until = NULL,
                       history = push.append_history(j.history, jsonb_build_object(
                           'outcome', 'cancelled', 'at', now(), 'by', current_user, 'was', t.state))
                  FROM targets AS t
                 WHERE j.id = t.id
                RETURNING j.id, t.state AS was
            ), notified AS (
                -- NOTIFY payloads stop at 8,000 bytes: 300 ids (at most 20 characters each) a notification.
                SELECT pg_notify('push_jobs', '\(Self.cancelNotificationPrefix)' || string_agg(id::text, ','))
                  FROM (SELECT id, (row_number() OVER (ORDER BY id) - 1) / 300 AS part
                          FROM cancelled WHERE was = 'running') AS c
                 GROUP BY part
            )
            SELECT c.id, c.was, (SELECT count(*) FROM notified) FROM cancelled AS c
            UNION ALL
            SELECT a.id, coalesce(j.state, CASE WHEN d.id IS NOT NULL THEN 'dead letter' END), 0
              FROM unnest($1::bigint[]) AS a (id)
              LEFT JOIN push.jobs AS j ON j.id = a.id
              LEFT JOIN push.dead_jobs AS d ON d.id = a.id
             WHERE a.id NOT IN (SELECT id FROM cancelled)
            """
        var result = CancelResult(cancelled: [], heldByWorkers: [], ended: [:], missing: [])
        let rows = try await self.client.query(PostgresQuery(unsafeSQL: sql, binds: binds), logger: self.logger)
        var seen = Set<Int64>()
        for try await (id, state, _) in rows.decode((Int64, String?, Int64).self) {
            guard seen.insert(id).inserted else { continue }
            switch state {
            case "pending": result.cancelled.append(id)
            case "running": result.heldByWorkers.append(id)
            case .some(let other): result.ended[String(id)] = other
            case .none: result.missing.append(id)
            }
        }
        result.cancelled.sort()
        result.heldByWorkers.sort()
        result.missing.sort()
        return result
    }
}

extension JobQueue {
    /// Every pause, oldest first; with `countingJobs`, how many pending jobs each holds.
    public func pauses(countingJobs: Bool = false) async throws -> [Pause] {
        let rows = try await self.client.query(
            """
            SELECT p.credential, p.topic, p.reason, p.created_at, p.created_by,
                   CASE WHEN \(countingJobs) THEN (
                       SELECT count(*) FROM push.jobs AS j
                        WHERE j.state = 'pending' AND (p.credential IS NULL OR j.credential = p.credential)
                          AND (p.topic IS NULL OR j.topic = p.topic)) END
              FROM push.pauses AS p ORDER BY p.created_at, p.id
            """,
            logger: self.logger
        )
        var pauses: [Pause] = []
        for try await (credential, topic, reason, at, by, count) in rows.decode(
            (String?, String?, String, Date, String, Int64?).self
        ) {
            pauses.append(
                Pause(
                    credential: credential,
                    topic: topic,
                    reason: reason,
                    createdAt: at,
                    createdBy: by,
                    pendingJobs: count.map(Int.init)
                )
            )
        }
        return pauses
    }
}
