import Foundation
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
        try await self.claimBatch(
            limit: limit,
            workerID: workerID,
            lease: lease,
            excludingCredentials: excludingCredentials,
            onlyCredentials: onlyCredentials,
            excludingEnvironments: excludingEnvironments,
            excludingPairs: excludingPairs,
            excludingIDs: excludingIDs
        ).jobs
    }

    /// What one claim did: the jobs it claimed, how many older jobs it superseded (`coalesce_key`), and
    /// how soon a rate limit's schedule has room again.
    public struct ClaimBatch: Sendable {
        /// The claimed jobs, in claim order.
        public var jobs: [PushJob]
        /// Older due jobs that share a claimed job's `coalesce_key`: now `superseded`, never sent.
        public var superseded: Int
        /// When a rate limit's schedule is full: how long until it has room again (claim again then).
        public var rateLimitedFor: Duration?
        /// A range of the claim gave its whole share: more due work is likely waiting, claim again at once
        /// (a busy credential's share grows once the others have nothing due).
        public var mayHaveMore: Bool = false
    }

    /// ``claim(limit:workerID:lease:excludingCredentials:onlyCredentials:excludingEnvironments:excludingPairs:excludingIDs:)``
    /// with what else the claim did. Besides the turns and priorities, the fleet-wide controls apply here,
    /// in the same statement:
    ///
    /// - `push.pauses`: a paused credential is left out of the ranges (its backlog is never read); a paused
    ///   topic's jobs are skipped.
    /// - `push.rate_limits`: each limit (the most specific row matching the job's credential and topic) is a
    ///   fleet-wide schedule: a claimed job gets the next send time (`sendAt`, one interval after the previous
    ///   one), and a limit takes jobs only while those times fall within `burst` intervals of now.
    /// - `coalesce_key`: only the newest due pending job of a key is claimable; claiming it marks the older
    ///   due ones `superseded`. A job already running is never touched.
    /// - Dead tokens: each claimed job carries `tokenInvalidatedAt` when its token died after it was enqueued.
    ///
    /// `includingRateLimited: false` leaves every rate-limited job for later: a worker with a backlog of
    /// sends passes it, so the spacing the bucket gives the claims survives into the requests.
    public func claimBatch(
        limit: Int,
        workerID: String,
        lease: Duration,
        excludingCredentials: [String] = [],
        onlyCredentials: [String]? = nil,
        excludingEnvironments: [String] = [],
        excludingPairs: [String] = [],
        excludingTopics: [String] = [],
        excludingIDs: [Int64] = [],
        includingRateLimited: Bool = true
    ) async throws -> ClaimBatch {
        guard limit > 0 else { return ClaimBatch(jobs: [], superseded: 0, rateLimitedFor: nil, mayHaveMore: false) }
        let leaseSeconds = Double(lease.components.seconds) + Double(lease.components.attoseconds) / 1e18
        // The order of claimSQL's $1…$12.
        var binds = PostgresBindings(capacity: 12)
        binds.append(onlyCredentials ?? [])
        binds.append(onlyCredentials == nil)
        binds.append(excludingCredentials)
        binds.append(leaseSeconds / 2)
        binds.append(excludingEnvironments)
        binds.append(excludingPairs)
        binds.append(excludingIDs)
        binds.append(includingRateLimited)
        binds.append(Int64(limit))
        binds.append(workerID)
        binds.append(leaseSeconds)
        binds.append(excludingTopics)
        var superseded = 0
        var limitedMs: Int64?
        var more = false
        // Claimed, but a newer job of the same key was claimed meanwhile by another worker: never sent.
        var stale: [(id: Int64, attempt: Int, by: Int64)] = []
        var jobs: [PushJob] = []
        jobs.reserveCapacity(limit)
        var undecodable: [(id: Int64, attempt: Int, error: String)] = []
        func read(_ row: PostgresRow) throws {
            var cursor = RowCursor(row)
            superseded = Int(try cursor.next(Int64.self))
            limitedMs = try cursor.next(Int64?.self)
            more = try cursor.next(Bool.self)
            let supersededBy = try cursor.next(Int64?.self)
            let tokenInvalidatedAt = try cursor.next(Date?.self)
            let sendIn = try cursor.next(Double?.self)
            let sendScope = try cursor.next(Int64?.self)
            let sendInterval = try cursor.next(Double?.self)
            // The one row of a claim that took nothing carries only the counts.
            if cursor.nextIsNull() { return }
            do {
                var job = try Self.decodeJob(&cursor)
                job.tokenInvalidatedAt = tokenInvalidatedAt
                // Relative to the row's database clock (db_now): the claim loop turns it into its own clock.
                job.sendAt = sendIn.map { (job.claimedAt ?? Date()).addingTimeInterval($0) }
                if let sendScope, let sendInterval {
                    job.sendSpacing = SendSpacing(scope: sendScope, interval: sendInterval)
                }
                if let supersededBy {
                    stale.append((job.id, job.attempts, supersededBy))
                } else {
                    jobs.append(job)
                }
            } catch {
                let c = row.makeRandomAccess()
                // A row the schema let through but Swift cannot read: it must not fail its batch (the claim
                // has committed). It goes to the dead letters, fenced by its attempt, with what was wrong.
                undecodable.append(
                    (try c["id"].decode(Int64.self), Int(try c["attempts"].decode(Int16.self)), "\(error)")
                )
            }
        }
        try await self.forEachRow(of: ClaimStatement.self, binds: binds, read)
        if !stale.isEmpty {
            superseded += try await self.supersedeClaimed(stale, workerID: workerID)
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
        return ClaimBatch(
            jobs: jobs,
            superseded: superseded,
            rateLimitedFor: limitedMs.map { .milliseconds(max($0, 1)) },
            mayHaveMore: more
        )
    }

    /// The claim (``claimBatch(limit:workerID:lease:excludingCredentials:onlyCredentials:excludingEnvironments:excludingPairs:excludingTopics:excludingIDs:includingRateLimited:)``):
    /// $1 the worker's credentials, $2 whether it claims any credential, $3 paused credentials, $4 half
    /// the lease in seconds, $5 unreachable environments, $6 backing-off `environment/credential` pairs,
    /// $7 jobs still held, $8 whether rate-limited jobs are taken, $9 the limit, $10 the worker, $11 the
    /// lease in seconds, $12 `credential/topic` pairs APNs refused (TopicDisallowed).
    static let claimSQL = """
        -- Claim any credential (tests, tools): the distinct credentials with pending jobs (read only then).
        WITH RECURSIVE \(pendingCredentials), paused AS MATERIALIZED (
            SELECT credential, topic FROM push.pauses
        ), credentials AS (
            SELECT c FROM (
                SELECT unnest($1::text[]) AS c WHERE NOT $2
                UNION
                SELECT credential FROM pending_credentials WHERE $2 AND credential IS NOT NULL
            ) AS x
             WHERE NOT (c = ANY ($3::text[]))
               -- A pause of a whole credential (or of everything) leaves it out: its backlog is never read.
               AND NOT EXISTS (SELECT 1 FROM paused AS p
                                WHERE p.topic IS NULL AND (p.credential IS NULL OR p.credential = x.c))
        ), held_limits AS MATERIALIZED (
            -- The fleet's send schedules this claim may use, locked, read after the lock. SKIP LOCKED: a
            -- schedule another claimer holds right now counts as full for this claim (its jobs wait for the
            -- next claim), so claimers never queue on the limits and no worker over-claims. Only the
            -- limits of the credentials this claim reads are locked.
            -- A claim that leaves limited jobs for later ($8 false) locks none.
            SELECT id, next_send_at FROM push.rate_limits
             WHERE $8 AND (credential IS NULL OR credential IN (SELECT c FROM credentials))
             ORDER BY id FOR UPDATE SKIP LOCKED
        ), budgets AS MATERIALIZED (
            -- A limit takes jobs while their send times (one interval apart, from its tail or now) fall within
            -- the look-ahead of now: burst intervals, at most half the lease but never less than one
            -- interval, so any rate sends, however slow. Times are clock_timestamp(), taken after the lock.
            SELECT l.id, l.credential, l.topic, l.per_second, t.start, t.at, h.id IS NOT NULL AS held,
                   CASE WHEN h.id IS NULL THEN 0
                        ELSE \(available(perSecond: "l.per_second", burst: "l.burst", delay: "extract(epoch FROM t.start - t.at)", halfLease: "$4")) END AS available
              FROM (SELECT id, credential, topic, per_second::float8 AS per_second, burst::float8 AS burst,
                           next_send_at FROM push.rate_limits) AS l
              LEFT JOIN held_limits AS h ON h.id = l.id
             CROSS JOIN LATERAL (SELECT greatest(coalesce(h.next_send_at, l.next_send_at), c.at) AS start, c.at
                                   FROM (SELECT clock_timestamp() AS at) AS c) AS t
        ), pairs AS MATERIALIZED (
            -- The (credential, environment) pairs still claimable: paused credentials, unreachable
            -- environments and backing-off pools are left out here, so their backlog is never read.
            SELECT c.c, e.environment
              FROM credentials AS c
             CROSS JOIN (VALUES ('production'), ('development')) AS e(environment)
             WHERE NOT (e.environment = ANY ($5::text[]))
               AND NOT (e.environment || '/' || c.c = ANY ($6::text[]))
        ), pair_topics AS (
            -- The topics with pending jobs of each pair: a skip scan of jobs_claim_by_topic_idx, one probe per
            -- topic (a last row of NULL ends each pair).
            SELECT p.c, p.environment,
                   (SELECT j.topic FROM push.jobs AS j
                     WHERE j.state = 'pending' AND j.credential = p.c AND j.environment = p.environment
                     ORDER BY j.topic LIMIT 1) AS topic
              FROM pairs AS p
            UNION ALL
            SELECT t.c, t.environment,
                   (SELECT j.topic FROM push.jobs AS j
                     WHERE j.state = 'pending' AND j.credential = t.c AND j.environment = t.environment
                       AND j.topic > t.topic
                     ORDER BY j.topic LIMIT 1)
              FROM pair_topics AS t WHERE t.topic IS NOT NULL
        ), topic_ranges AS MATERIALIZED (
            -- Each (credential, environment, topic) with its limit, the most specific that matches. A paused
            -- topic and a limit with no room are left out here, as whole ranges: their backlog is never read.
            SELECT t.c AS credential, t.environment, t.topic, s.scope, s.available
              FROM pair_topics AS t
              LEFT JOIN LATERAL (
                SELECT b.id AS scope, b.available FROM budgets AS b
                 WHERE (b.credential IS NULL OR b.credential = t.c) AND (b.topic IS NULL OR b.topic = t.topic)
                 ORDER BY b.credential IS NULL, b.topic IS NULL LIMIT 1
              ) AS s ON true
             WHERE t.topic IS NOT NULL
               AND NOT (t.c || '/' || t.topic = ANY ($12::text[]))
               AND NOT EXISTS (SELECT 1 FROM paused AS p
                                WHERE p.topic = t.topic AND (p.credential IS NULL OR p.credential = t.c))
               AND (s.scope IS NULL OR ($8 AND s.available >= 1))
               -- Due work (three index probes): a topic with nothing due is not read, and a credential with
               -- nothing due takes no share of the batch. Scalar probes, not EXISTS: the planner turns EXISTS
               -- into a semi-join over the whole index.
               AND ((SELECT true FROM push.jobs AS x
                      WHERE x.state = 'pending' AND x.credential = t.c AND x.environment = t.environment
                        AND x.topic = t.topic AND x.send_priority = 10 AND x.run_at <= now() LIMIT 1)
                    OR (SELECT true FROM push.jobs AS x
                         WHERE x.state = 'pending' AND x.credential = t.c AND x.environment = t.environment
                           AND x.topic = t.topic AND x.send_priority = 5 AND x.run_at <= now() LIMIT 1)
                    OR (SELECT true FROM push.jobs AS x
                         WHERE x.state = 'pending' AND x.credential = t.c AND x.environment = t.environment
                           AND x.topic = t.topic AND x.send_priority = 1 AND x.run_at <= now() LIMIT 1))
        ), ranges AS MATERIALIZED (
            -- Every (credential, environment, topic, priority) to read. Each credential with due work takes
            -- an equal share of the batch, split among its topics with due work (a configured credential with
            -- nothing due takes none); a limited topic reads no more than its limit's room.
            SELECT r.credential, r.environment, r.topic, r.scope, p.priority, p.weight,
                   least(ceil($9::float8 / (SELECT count(DISTINCT credential) FROM topic_ranges)
                              / count(*) OVER (PARTITION BY r.credential, p.priority)),
                         coalesce(floor(r.available), $9::float8))::bigint AS share
              FROM topic_ranges AS r
             CROSS JOIN (VALUES (10::smallint, 8.0::float8), (5::smallint, 2.0::float8), (1::smallint, 1.0::float8))
                   AS p(priority, weight)
        ), candidates AS MATERIALIZED (
            -- One index range scan per range: only due, claimable rows are read. Each range locks at most
            -- its share of the batch, so concurrent claimers are not starved of rows.
            SELECT x.id, r.credential, r.environment, r.topic, x.send_priority, x.run_at, r.weight, r.scope,
                   x.mark, r.share
              FROM ranges AS r
             CROSS JOIN LATERAL (
                SELECT j.id, j.send_priority, j.run_at,
                       -- Latest wins: a job below its key's high-water mark is superseded here, never sent.
                       CASE WHEN m.high_id > j.id THEN m.high_id END AS mark
                  FROM push.jobs AS j
                  -- A lateral probe (LIMIT 1 keeps the planner from turning it into a join): a nested loop
                  -- keeps the index's order, so the LIMIT stops the range scan early; a hash join would read
                  -- the whole range and sort it.
                  LEFT JOIN LATERAL (
                    SELECT k.high_id FROM push.coalesce_marks AS k
                     WHERE j.coalesce_key IS NOT NULL AND k.topic = j.topic AND k.environment = j.environment
                       AND k.coalesce_key = j.coalesce_key
                     LIMIT 1
                  ) AS m ON true
                 WHERE j.state = 'pending' AND j.credential = r.credential AND j.environment = r.environment
                   AND j.topic = r.topic AND j.send_priority = r.priority AND j.run_at <= now()
                   AND (cardinality($7::bigint[]) = 0 OR NOT (j.id = ANY ($7::bigint[])))
                   -- Latest wins: a job with a newer due pending job of the same key (same topic and
                   -- environment) is not claimable (a newer one another claimer holds right now counts too:
                   -- it is still pending here).
                   AND (j.coalesce_key IS NULL OR m.high_id > j.id OR NOT EXISTS (
                        SELECT 1 FROM push.jobs AS n
                         WHERE n.coalesce_key = j.coalesce_key AND n.state = 'pending' AND n.id > j.id
                           AND n.topic = j.topic AND n.environment = j.environment AND n.run_at <= now()))
                 -- The range's own columns lead the order (they are constant in it), so the planner walks
                 -- jobs_claim_by_topic_idx: an empty range costs one probe.
                 ORDER BY j.credential, j.environment, j.topic, j.send_priority, j.run_at, j.id
                 LIMIT r.share
                 FOR NO KEY UPDATE OF j SKIP LOCKED
             ) AS x
        ), ordered AS (
            -- Interleave: each credential gets its turn (fair share), and within one, priority 10
            -- takes 8 places to priority 5's 2 and priority 1's 1; the first job of every range goes
            -- first, so lower priorities progress even when the batch is small.
            SELECT id, scope, run_at,
                   (row_number() OVER (PARTITION BY credential, environment, topic, send_priority ORDER BY run_at, id)
                    - 1) / weight AS turn
              FROM candidates WHERE mark IS NULL
        ), capped AS (
            SELECT o.*, row_number() OVER (PARTITION BY o.scope ORDER BY o.turn, o.run_at, o.id) AS k
              FROM ordered AS o
        ), picked AS MATERIALIZED (
            -- A limited job takes the next slot of its limit's schedule (k: its place in the schedule).
            SELECT c.id, c.scope, c.k FROM capped AS c LEFT JOIN budgets AS b ON b.id = c.scope
             WHERE c.scope IS NULL OR c.k <= floor(b.available)
             ORDER BY c.turn, c.run_at, c.id
             LIMIT $9
        ), spent AS (
            UPDATE push.rate_limits AS l
               SET next_send_at = b.start + make_interval(secs => u.n / b.per_second)
              FROM budgets AS b
              JOIN (SELECT scope, count(*) AS n FROM picked WHERE scope IS NOT NULL GROUP BY scope) AS u
                ON u.scope = b.id
             WHERE l.id = b.id AND b.held
            RETURNING l.id, b.available - u.n AS left_over, b.per_second
        ), claimed AS (
            UPDATE push.jobs AS j
               SET state = 'running',
                   attempts = j.attempts + 1,
                   locked_by = $10,
                   locked_until = now() + make_interval(secs => $11)
             WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
            RETURNING j.*
        ), marks AS (
            -- Each claimed key's high-water mark. ON CONFLICT reads the newest committed mark, so a claimed
            -- job below a mark another claimer set meanwhile is known here: it is returned with that mark and
            -- the worker supersedes it instead of sending it.
            INSERT INTO push.coalesce_marks AS m (topic, environment, coalesce_key, high_id)
            SELECT topic, environment, coalesce_key, max(id) FROM claimed WHERE coalesce_key IS NOT NULL
             GROUP BY topic, environment, coalesce_key ORDER BY topic, environment, coalesce_key
            ON CONFLICT (topic, environment, coalesce_key)
               DO UPDATE SET high_id = greatest(m.high_id, excluded.high_id), updated_at = now()
            RETURNING m.topic, m.environment, m.coalesce_key, m.high_id
        ), superseded AS (
            -- Latest wins: the older jobs of a claimed job's key end here, never sent, whatever they were
            -- doing (waiting, scheduled for a retry, returned by the reaper); a running one completes. Rows
            -- another statement holds are skipped: they meet the mark when they are next claimable.
            UPDATE push.jobs AS o
               -- No history entry: superseded_by says it all, and a large backlog is cheaper to retire.
               SET state = 'superseded', superseded_by = x.by, reason = 'Superseded', locked_by = NULL,
                   locked_until = NULL
              FROM (SELECT o.id, c.id AS by FROM push.jobs AS o
                      -- At most one claimed job per key: an older one with a newer due job is not claimable.
                      JOIN claimed AS c ON c.coalesce_key = o.coalesce_key AND c.topic = o.topic
                       AND c.environment = o.environment AND o.id < c.id
                     WHERE c.coalesce_key IS NOT NULL AND o.coalesce_key IS NOT NULL AND o.state = 'pending'
                       AND NOT (o.id = ANY (ARRAY(SELECT id FROM candidates WHERE mark IS NOT NULL)))
                       FOR NO KEY UPDATE OF o SKIP LOCKED) AS x
             WHERE o.id = x.id AND o.state = 'pending'
            RETURNING o.id
        ), below AS (
            -- Jobs of this claim's ranges already below their key's mark.
            UPDATE push.jobs AS o
               SET state = 'superseded', superseded_by = c.mark, reason = 'Superseded', locked_by = NULL,
                   locked_until = NULL
              FROM candidates AS c
             WHERE c.mark IS NOT NULL AND o.id = c.id AND o.state = 'pending'
            RETURNING o.id
        )
        -- Read by position (RowCursor): the claim's own columns, then the job's.
        SELECT m.superseded_count, m.limited_ms, m.more,
               (SELECT mk.high_id FROM marks AS mk
                 WHERE mk.topic = j.topic AND mk.environment = j.environment AND mk.coalesce_key = j.coalesce_key
                   AND mk.high_id > j.id) AS superseded_by,
               (SELECT t.invalidated_at FROM push.invalid_tokens AS t
                 WHERE t.device_token = j.device_token AND t.topic = j.topic AND t.environment = j.environment
                   AND t.invalidated_at > j.created_at) AS token_invalidated_at,
               -- A limited job's send time, as seconds from the moment its schedule was read: the worker counts
               -- them from when it reads the row, so a slow statement delays the send, never advances it.
               s.send_in, s.scope AS send_scope, s.send_interval,
               \(jobColumns)
          FROM (SELECT (SELECT count(*) FROM superseded) + (SELECT count(*) FROM below) AS superseded_count,
                       -- A schedule now full (or one that had no room): when its next slot opens.
                       (SELECT ceil(min(w) * 1000)::bigint FROM (
                            SELECT (1 - left_over) / per_second AS w FROM spent WHERE left_over < 1
                            UNION ALL
                            SELECT (1 - available) / per_second FROM budgets
                             WHERE held AND available < 1 AND id NOT IN (SELECT id FROM spent)) AS x) AS limited_ms,
                       -- A range gave all its share: more due work is likely waiting (claim again at once).
                       EXISTS (SELECT 1 FROM candidates AS c
                                GROUP BY c.credential, c.environment, c.topic, c.send_priority, c.share
                               HAVING count(*) >= c.share) AS more) AS m
          LEFT JOIN claimed AS j ON true
          -- Joined once (a hash join), not a subquery per row: picked has a row per claimed job.
          LEFT JOIN (SELECT p.id, p.scope, extract(epoch FROM b.start - b.at)::float8 + (p.k - 1) / b.per_second AS send_in,
                            1 / b.per_second AS send_interval
                       FROM picked AS p JOIN budgets AS b ON b.id = p.scope) AS s ON s.id = j.id
         ORDER BY j.send_priority DESC, j.run_at, j.id
        """

    /// How many jobs a limit lets a claim take now, as SQL: the slots whose send times (one interval apart,
    /// the first `delay` seconds from now) fall within the look-ahead: `burst` intervals, at most half the
    /// lease but never less than one interval, so any rate sends. In float8 `(1 / r) * r` can come out just
    /// under 1 (for 82 of the integer rates 1-1000): a tolerance keeps such a limit from never sending. The
    /// claim and `push-worker limits` both use this.
    static func available(perSecond r: String, burst b: String, delay d: String, halfLease h: String) -> String {
        "floor((least(\(b) / \(r), greatest(\(h), 1 / \(r))) - \(d)) * \(r) + 1e-9)"
    }

    /// The columns `decodeJob` reads, by position: the order here is the order there.
    static let jobColumns = """
        j.id, j.apns_id, j.topic, j.device_token, j.channel_id, j.payload::text AS payload, j.push_type, j.priority,
        j.environment, j.credential, j.collapse_id, j.deliver_once, j.expires_at, j.run_at, j.max_attempts, j.attempts,
        j.trap_ids, j.created_at, j.first_attempt_at, j.transport_retries, clock_timestamp() AS db_now, j.coalesce_key
        """

    /// A job from a row whose first columns are ``jobColumns``, read by position.
    static func decodeJob(_ row: PostgresRow) throws -> PushJob {
        var cursor = RowCursor(row)
        return try decodeJob(&cursor)
    }

    /// A job from the cursor's next columns, ``jobColumns`` in their order.
    static func decodeJob(_ c: inout RowCursor) throws -> PushJob {
        PushJob(
            id: try c.next(Int64.self),
            apnsID: try c.next(UUID.self),
            topic: try c.next(String.self),
            deviceToken: try c.next(String?.self),
            channelID: try c.next(String?.self),
            payload: try c.next(String.self),
            pushType: try c.next(String.self),
            priority: try c.next(Int16?.self).map(Int.init),
            environment: try c.next(String.self),
            credential: try c.next(String.self),
            collapseID: try c.next(String?.self),
            deliverOnce: try c.next(Bool.self),
            expiresAt: try c.next(Date?.self),
            runAt: try c.next(Date.self),
            maxAttempts: try c.next(Int16?.self).map(Int.init),
            attempts: Int(try c.next(Int16.self)),
            trapIDs: try c.next([String].self).map(TrapID.init(rawValue:)),
            createdAt: try c.next(Date.self),
            firstAttemptAt: try c.next(Date?.self),
            transportRetries: Int(try c.next(Int16.self)),
            claimedAt: try c.next(Date.self),
            coalesceKey: try c.next(String?.self)
        )
    }
}

extension JobQueue {
    /// Ends claimed jobs `superseded` without a request: a newer job of the same key was claimed by another
    /// worker while this claim ran. Fenced on (id, attempt, worker); the attempt is not counted.
    ///
    /// - Returns: how many were superseded.
    func supersedeClaimed(_ jobs: [(id: Int64, attempt: Int, by: Int64)], workerID: String) async throws -> Int {
        let sorted = jobs.sorted { $0.id < $1.id }
        var count = 0
        for try await _ in try await self.client.query(
            """
            UPDATE push.jobs AS j
               SET state = 'superseded', superseded_by = i.by, reason = 'Superseded', attempts = j.attempts - 1,
                   locked_by = NULL, locked_until = NULL
              FROM unnest(\(sorted.map(\.id))::bigint[], \(sorted.map { Int16(clamping: $0.attempt) })::smallint[],
                          \(sorted.map(\.by))::bigint[]) AS i(id, attempt, by)
             WHERE j.id = i.id AND j.attempts = i.attempt AND j.locked_by = \(workerID) AND j.state = 'running'
            RETURNING j.id
            """,
            logger: self.logger
        ) {
            count += 1
        }
        return count
    }

    /// How long until the next pending job falls due, on the database's clock (zero if one is due now),
    /// or `nil` when none is pending.
    public func untilNextDue() async throws -> Duration? {
        let rows = try await self.client.query(
            """
            SELECT (extract(epoch FROM (\(unescaped: Self.earliestPendingRunAt) - now())) * 1000)::bigint
            """,
            logger: self.logger
        )
        for try await ms in rows.decode(Int64?.self) { return ms.map { .milliseconds(max($0, 0)) } }
        return nil
    }

    /// The CTE `pending_credentials`: the distinct credentials with pending jobs, by a skip scan of
    /// `jobs_claim_by_topic_idx` (one probe per credential, not a scan of the backlog); a last row of NULL
    /// ends it. Evaluated only where it is read.
    static let pendingCredentials = """
        pending_credentials AS (
            (SELECT credential FROM push.jobs WHERE state = 'pending' ORDER BY credential LIMIT 1)
            UNION ALL
            SELECT (SELECT j.credential FROM push.jobs AS j
                     WHERE j.state = 'pending' AND j.credential > p.credential ORDER BY j.credential LIMIT 1)
              FROM pending_credentials AS p WHERE p.credential IS NOT NULL
        )
        """

    /// The earliest `run_at` of any pending job, as a scalar subquery: the (credential, environment, topic)
    /// ranges of `jobs_claim_by_topic_idx` found by a skip scan (one probe each), then one probe per send
    /// priority in each. Never a scan of the backlog.
    static let earliestPendingRunAt = """
        (WITH RECURSIVE pending_ranges AS (
            (SELECT credential, environment, topic FROM push.jobs WHERE state = 'pending'
              ORDER BY credential, environment, topic LIMIT 1)
            UNION ALL
            SELECT n.credential, n.environment, n.topic FROM pending_ranges AS p
             CROSS JOIN LATERAL (
                SELECT j.credential, j.environment, j.topic FROM push.jobs AS j
                 WHERE j.state = 'pending' AND (j.credential, j.environment, j.topic) > (p.credential, p.environment, p.topic)
                 ORDER BY j.credential, j.environment, j.topic LIMIT 1) AS n
        )
        SELECT min(f.run_at) FROM pending_ranges AS r
         CROSS JOIN (VALUES (10::smallint), (5::smallint), (1::smallint)) AS p(priority)
         CROSS JOIN LATERAL (
            SELECT j.run_at FROM push.jobs AS j
             WHERE j.state = 'pending' AND j.credential = r.credential AND j.environment = r.environment
               AND j.topic = r.topic AND j.send_priority = p.priority
             ORDER BY j.run_at LIMIT 1) AS f)
        """
}

/// ``JobQueue/claimSQL``, prepared once per connection. Planning the claim cost 1.6 ms per call (16 µs per
/// job at the drain's 95 jobs per claim); the worker's sessions run with `plan_cache_mode =
/// force_generic_plan` (``JobQueue/workerSessionSettings``), so it is planned once per connection.
enum ClaimStatement: BatchStatement {
    static let name = "push_claim_v3"
    static let sql = JobQueue.claimSQL
}
