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
    ///   - excludingPairs: `environment/credential` pairs whose APNs pool is backing off: their jobs wait.
    ///   - excludingIDs: jobs this worker still holds (an outcome not yet written): never claimed twice.
    /// - Returns: the claimed jobs, in claim order, with `attempts` counting this attempt.
    public func claim(
        limit: Int,
        workerID: String,
        lease: Duration,
        excludingCredentials: [String] = [],
        onlyCredentials: [String]? = nil,
        excludingEnvironments: [String] = [],
        excludingPairs: [String] = [],
        excludingIDs: [Int64] = []
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
                   AND (cardinality(\(excludingPairs)::text[]) = 0 OR NOT (environment || '/' || credential = ANY (\(excludingPairs)::text[])))
                   AND (cardinality(\(excludingIDs)::bigint[]) = 0 OR NOT (id = ANY (\(excludingIDs)::bigint[])))
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

    /// The columns `decodeJob` reads, by name.
    static let jobColumns = """
        j.id, j.apns_id, j.topic, j.device_token, j.channel_id, j.payload::text AS payload, j.push_type, j.priority,
        j.environment, j.credential, j.collapse_id, j.expires_at, j.run_at, j.max_attempts, j.attempts,
        j.trap_ids, j.created_at, j.first_attempt_at, j.transport_retries, now() AS db_now
        """

    /// A job from a row that selected ``jobColumns``; columns are read by name.
    static func decodeJob(_ row: PostgresRow) throws -> PushJob {
        let c = row.makeRandomAccess()
        return PushJob(
            id: try c["id"].decode(Int64.self),
            apnsID: try c["apns_id"].decode(UUID.self),
            topic: try c["topic"].decode(String.self),
            deviceToken: try c["device_token"].decode(String?.self),
            channelID: try c["channel_id"].decode(String?.self),
            payload: try c["payload"].decode(String.self),
            pushType: try c["push_type"].decode(String.self),
            priority: try c["priority"].decode(Int16?.self).map(Int.init),
            environment: try c["environment"].decode(String.self),
            credential: try c["credential"].decode(String.self),
            collapseID: try c["collapse_id"].decode(String?.self),
            expiresAt: try c["expires_at"].decode(Date?.self),
            runAt: try c["run_at"].decode(Date.self),
            maxAttempts: try c["max_attempts"].decode(Int16?.self).map(Int.init),
            attempts: Int(try c["attempts"].decode(Int16.self)),
            trapIDs: try c["trap_ids"].decode([String].self).map(TrapID.init(rawValue:)),
            createdAt: try c["created_at"].decode(Date.self),
            firstAttemptAt: try c["first_attempt_at"].decode(Date?.self),
            transportRetries: Int(try c["transport_retries"].decode(Int16.self)),
            claimedAt: try c["db_now"].decode(Date.self)
        )
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
