public import Foundation
import PostgresNIO
public import PushCore

extension JobQueue {
    /// Claims up to `limit` due jobs for `workerID`: marks them `running`, counts the attempt, and sets a
    /// lease until now + `lease`. Highest send priority first, then oldest `run_at`, then id.
    ///
    /// Concurrent claimers never get the same job: rows are picked `FOR NO KEY UPDATE SKIP LOCKED` in a
    /// materialized CTE and updated in the same statement.
    ///
    /// - Parameters:
    ///   - limit: at most this many jobs (the sender's free capacity).
    ///   - workerID: the claimer's name, written to `locked_by` and required by every outcome write.
    ///   - lease: how long the claim holds before the reaper may return the job to `pending`; longer
    ///     than the request deadline.
    ///   - excludingCredentials: credentials whose jobs must stay pending (paused after a credential fault).
    ///   - onlyCredentials: the credentials this worker can sign for; `nil` claims any.
    ///   - excludingEnvironments: environments whose APNs endpoint is unreachable now: their jobs wait.
    /// - Returns: the claimed jobs, in claim order, with `attempts` counting this attempt.
    public func claim(
        limit: Int,
        workerID: String,
        lease: Duration,
        excludingCredentials: [String] = [],
        onlyCredentials: [String]? = nil,
        excludingEnvironments: [String] = []
    ) async throws -> [PushJob] {
        guard limit > 0 else { return [] }
        let anyCredential = onlyCredentials == nil
        let mine = onlyCredentials ?? []
        let leaseSeconds = Double(lease.components.seconds) + Double(lease.components.attoseconds) / 1e18
        let rows = try await self.client.query(
            """
            WITH picked AS MATERIALIZED (
                SELECT id FROM push.jobs
                 WHERE state = 'pending' AND run_at <= now()
                   AND NOT (credential = ANY (\(excludingCredentials)::text[]))
                   AND (\(anyCredential) OR credential = ANY (\(mine)::text[]))
                   AND NOT (environment = ANY (\(excludingEnvironments)::text[]))
                 ORDER BY send_priority DESC, run_at, id
                 LIMIT \(Int64(limit))
                 FOR NO KEY UPDATE SKIP LOCKED
            ), claimed AS (
                UPDATE push.jobs AS j
                   SET state = 'running',
                       attempts = j.attempts + 1,
                       locked_by = \(workerID),
                       locked_until = now() + make_interval(secs => \(leaseSeconds))
                 WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
                RETURNING j.*
            )
            SELECT \(unescaped: Self.jobColumns) FROM claimed AS j
             ORDER BY j.send_priority DESC, j.run_at, j.id
            """,
            logger: self.logger
        )
        var jobs: [PushJob] = []
        jobs.reserveCapacity(limit)
        for try await row in rows {
            jobs.append(try Self.decodeJob(row))
        }
        return jobs
    }

    /// How many columns ``jobColumns`` lists: later columns of a query start here.
    static let jobColumnCount = 20

    /// The columns `decodeJob` reads, in its order.
    static let jobColumns = """
        j.id, j.apns_id, j.topic, j.device_token, j.channel_id, j.payload::text, j.push_type, j.priority,
        j.environment, j.credential, j.collapse_id, j.expires_at, j.run_at, j.max_attempts, j.attempts,
        j.trap_ids, j.created_at, j.first_attempt_at, j.transport_retries, now()
        """

    static func decodeJob(_ row: PostgresRow) throws -> PushJob {
        let r = try row.decode(
            (
                Int64, UUID, String, String?, String?, String, String, Int16?, String,
                String, String?, Date?, Date, Int16?, Int16, [String], Date, Date?, Int16, Date
            ).self
        )
        return PushJob(
            id: r.0,
            apnsID: r.1,
            topic: r.2,
            deviceToken: r.3,
            channelID: r.4,
            payload: r.5,
            pushType: r.6,
            priority: r.7.map(Int.init),
            environment: r.8,
            credential: r.9,
            collapseID: r.10,
            expiresAt: r.11,
            runAt: r.12,
            maxAttempts: r.13.map(Int.init),
            attempts: Int(r.14),
            trapIDs: r.15,
            createdAt: r.16,
            firstAttemptAt: r.17,
            transportRetries: Int(r.18),
            claimedAt: r.19
        )
    }
}

extension JobQueue {
    /// When the next pending job becomes due (the earliest `run_at`), or `nil` when none is pending:
    /// the claimer's timer for scheduled retries. One index probe per send priority.
    public func nextDueAt() async throws -> Date? {
        let rows = try await self.client.query(
            """
            SELECT min(next) FROM (
                SELECT (SELECT run_at FROM push.jobs
                         WHERE state = 'pending' AND send_priority = p ORDER BY run_at LIMIT 1) AS next
                  FROM unnest('{10,5,1}'::smallint[]) AS p) AS x
            """,
            logger: self.logger
        )
        for try await next in rows.decode(Date?.self) { return next }
        return nil
    }
}

extension JobQueue {
    /// How long until the next pending job falls due, on the database's clock (zero if one is due now),
    /// or `nil` when none is pending.
    public func untilNextDue() async throws -> Duration? {
        let rows = try await self.client.query(
            """
            SELECT (extract(epoch FROM (min(next) - now())) * 1000)::bigint FROM (
                SELECT (SELECT run_at FROM push.jobs
                         WHERE state = 'pending' AND send_priority = p ORDER BY run_at LIMIT 1) AS next
                  FROM unnest('{10,5,1}'::smallint[]) AS p) AS x
            """,
            logger: self.logger
        )
        for try await ms in rows.decode(Int64?.self) { return ms.map { .milliseconds(max($0, 0)) } }
        return nil
    }
}
