public import Foundation
import PostgresNIO
public import PushCore

extension JobQueue {
    /// Claims up to `limit` due jobs for `workerID`: marks them `running`, counts the attempt, and sets a
    /// lease until now + `lease`. Credentials take turns (a backlog of one never delays another's due jobs
    /// beyond one batch); within a credential, send priority 10, 5 and 1 share the batch 8 : 2 : 1 when all
    /// are due (strict priority otherwise starves the lower ones), each oldest `run_at` first.
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
            WITH RECURSIVE pending_credentials AS (
                -- Claim any credential (tests, tools): the distinct credentials with pending jobs, by a skip
                -- scan of the claim index (one probe per credential, not a scan of the backlog).
                (SELECT credential FROM push.jobs WHERE \(anyCredential) AND state = 'pending'
                  ORDER BY credential LIMIT 1)
                UNION ALL
                SELECT (SELECT j.credential FROM push.jobs AS j
                         WHERE j.state = 'pending' AND j.credential > p.credential ORDER BY j.credential LIMIT 1)
                  FROM pending_credentials AS p WHERE p.credential IS NOT NULL
            ), credentials AS (
                SELECT c, count(*) OVER () AS n FROM (
                    SELECT unnest(\(mine)::text[]) AS c WHERE NOT \(anyCredential)
                    UNION
                    SELECT credential FROM pending_credentials WHERE credential IS NOT NULL
                ) AS x
                 WHERE NOT (c = ANY (\(excludingCredentials)::text[]))
            ), ranges AS (
                -- Every (credential, environment, priority) still claimable: paused credentials, unreachable
                -- environments and backing-off pools are left out here, so their backlog is never read.
                SELECT c.c AS credential, e.environment, p.priority, p.weight, c.n
                  FROM credentials AS c
                 CROSS JOIN (VALUES ('production'), ('development')) AS e(environment)
                 CROSS JOIN (VALUES (10::smallint, 8.0::float8), (5::smallint, 2.0::float8), (1::smallint, 1.0::float8))
                       AS p(priority, weight)
                 WHERE NOT (e.environment = ANY (\(excludingEnvironments)::text[]))
                   AND NOT (e.environment || '/' || c.c = ANY (\(excludingPairs)::text[]))
            ), candidates AS MATERIALIZED (
                -- One index range scan per range: only due, claimable rows are read. Each range locks at most
                -- its credential's share of the batch, so concurrent claimers are not starved of rows.
                SELECT x.id, x.credential, x.environment, x.send_priority, x.run_at, r.weight
                  FROM ranges AS r
                 CROSS JOIN LATERAL (
                    SELECT j.id, j.credential, j.environment, j.send_priority, j.run_at FROM push.jobs AS j
                     WHERE j.state = 'pending' AND j.credential = r.credential AND j.environment = r.environment
                       AND j.send_priority = r.priority AND j.run_at <= now()
                       AND (cardinality(\(excludingIDs)::bigint[]) = 0 OR NOT (j.id = ANY (\(excludingIDs)::bigint[])))
                     ORDER BY j.run_at, j.id
                     LIMIT ceil(\(Int64(limit))::float8 / r.n)::bigint
                     FOR NO KEY UPDATE OF j SKIP LOCKED
                 ) AS x
            ), picked AS MATERIALIZED (
                -- Interleave: each credential gets its turn (fair share), and within one, priority 10
                -- takes 8 places to priority 5's 2 and priority 1's 1; the first job of every range goes
                -- first, so lower priorities progress even when the batch is small.
                SELECT id FROM (
                    SELECT id, run_at,
                           (row_number() OVER (PARTITION BY credential, environment, send_priority ORDER BY run_at, id)
                            - 1) / weight AS turn
                      FROM candidates) AS r
                 ORDER BY turn, run_at, id
                 LIMIT \(Int64(limit))
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
        var undecodable: [(id: Int64, attempt: Int, error: String)] = []
        for try await row in rows {
            do {
                jobs.append(try Self.decodeJob(row))
            } catch {
                // A row the schema let through but Swift cannot read: it must not fail its batch (the claim
                // has committed). It goes to the dead letters, fenced by its attempt, with what was wrong.
                let c = row.makeRandomAccess()
                undecodable.append(
                    (try c["id"].decode(Int64.self), Int(try c["attempts"].decode(Int16.self)), "\(error)")
                )
            }
        }
        for row in undecodable {
            let outcome = JobOutcome(
                jobID: row.id,
                attempt: row.attempt,
                disposition: .dead(sentence: ""),
                reason: "InvalidJob",
                sent: false
            )
            _ = try await self.deadLetterUnwritable(
                outcome,
                workerID: workerID,
                sentence:
                    "the worker could not read this row (\(row.error.prefix(200))): fix the producer and insert it again."
            )
        }
        return jobs
    }

    /// The columns `decodeJob` reads, by name.
    static let jobColumns = """
        j.id, j.apns_id, j.topic, j.device_token, j.channel_id, j.payload::text AS payload, j.push_type, j.priority,
        j.environment, j.credential, j.collapse_id, j.deliver_once, j.expires_at, j.run_at, j.max_attempts, j.attempts,
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
            deliverOnce: try c["deliver_once"].decode(Bool.self),
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
