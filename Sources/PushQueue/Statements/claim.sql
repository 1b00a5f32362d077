-- The claim: one statement takes a batch of due jobs for a worker (JobQueue.claimBatch, JobQueue+Claim.swift,
-- whose ClaimStatement declares the binds in order). Binds: :only_credentials the worker's credentials,
-- :any_credential whether it claims any credential, :excluded_credentials paused credentials,
-- :half_lease_seconds half the lease in seconds, :excluded_environments unreachable environments,
-- :excluded_pairs backing-off environment/credential pairs, :held_ids jobs still held, :include_rate_limited
-- whether rate-limited jobs are taken, :batch_limit the limit, :worker_id the worker, :lease_seconds the lease
-- in seconds, :excluded_topics credential/topic pairs APNs refused (TopicDisallowed).
-- The rate formula in held_limits is JobQueue.available(perSecond:burst:delay:halfLease:), which
-- `push-worker limits` uses too; SQLStatementTests keeps the two the same.
-- Claim any credential (tests, tools): the distinct credentials with pending jobs (read only then).
WITH RECURSIVE {{pending_credentials}}, paused AS MATERIALIZED (
    SELECT credential, topic FROM push.pauses
), credentials AS (
    SELECT c FROM (
        SELECT unnest(:only_credentials::text[]) AS c WHERE NOT :any_credential
        UNION
        SELECT credential FROM pending_credentials WHERE :any_credential AND credential IS NOT NULL
    ) AS x
     WHERE NOT (c = ANY (:excluded_credentials::text[]))
       -- A pause of a whole credential (or of everything) leaves it out: its backlog is never read.
       AND NOT EXISTS (SELECT 1 FROM paused AS p
                        WHERE p.topic IS NULL AND (p.credential IS NULL OR p.credential = x.c))
), held_limits AS MATERIALIZED (
    -- The fleet's send schedules this claim may use, locked, read after the lock. SKIP LOCKED: a
    -- schedule another claimer holds right now counts as full for this claim (its jobs wait for the
    -- next claim), so claimers never queue on the limits and no worker over-claims. Only the
    -- limits of the credentials this claim reads are locked.
    -- A claim that leaves limited jobs for later (:include_rate_limited false) locks none.
    SELECT id, next_send_at FROM push.rate_limits
     WHERE :include_rate_limited AND (credential IS NULL OR credential IN (SELECT c FROM credentials))
     ORDER BY id FOR UPDATE SKIP LOCKED
), budgets AS MATERIALIZED (
    -- A limit takes jobs while their send times (one interval apart, from its tail or now) fall within
    -- the look-ahead of now: burst intervals, at most half the lease but never less than one
    -- interval, so any rate sends, however slow. Times are clock_timestamp(), taken after the lock.
    SELECT l.id, l.credential, l.topic, l.per_second, t.start, t.at, h.id IS NOT NULL AS held,
           CASE WHEN h.id IS NULL THEN 0
                ELSE floor((least(l.burst / l.per_second, greatest(:half_lease_seconds, 1 / l.per_second)) - extract(epoch FROM t.start - t.at)) * l.per_second + 1e-9) END AS available
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
     -- FCM's jobs have environment 'fcm': its own pairs, its own pauses and backoff.
     CROSS JOIN (VALUES ('production'), ('development'), ('fcm')) AS e(environment)
     WHERE NOT (e.environment = ANY (:excluded_environments::text[]))
       AND NOT (e.environment || '/' || c.c = ANY (:excluded_pairs::text[]))
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
       -- Topic pauses are APNs' (TopicDisallowed): an Android app's jobs of the same id go on.
       AND NOT (t.environment <> 'fcm' AND t.c || '/' || t.topic = ANY (:excluded_topics::text[]))
       AND NOT EXISTS (SELECT 1 FROM paused AS p
                        WHERE p.topic = t.topic AND (p.credential IS NULL OR p.credential = t.c))
       AND (s.scope IS NULL OR (:include_rate_limited AND s.available >= 1))
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
           least(ceil(:batch_limit::float8 / (SELECT count(DISTINCT credential) FROM topic_ranges)
                      / count(*) OVER (PARTITION BY r.credential, p.priority)),
                 coalesce(floor(r.available), :batch_limit::float8))::bigint AS share
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
           AND (cardinality(:held_ids::bigint[]) = 0 OR NOT (j.id = ANY (:held_ids::bigint[])))
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
     LIMIT :batch_limit
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
           locked_by = :worker_id,
           locked_until = now() + make_interval(secs => :lease_seconds)
     WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING j.*
), marks AS (
    -- Each claimed key's high-water mark. ON CONFLICT reads the newest committed mark, so a claimed
    -- job below a mark another claimer set meanwhile is known here: it is returned with that mark and
    -- the worker supersedes it instead of sending it.
    -- The key's scope is (topic, environment): an fcm job's environment is 'fcm', so an iOS app and its
    -- Android app of the same id never share a mark.
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
    RETURNING o.id, o.apns_id, o.platform, o.topic, o.trap_ids
), below AS (
    -- Jobs of this claim's ranges already below their key's mark.
    UPDATE push.jobs AS o
       SET state = 'superseded', superseded_by = c.mark, reason = 'Superseded', locked_by = NULL,
           locked_until = NULL
      FROM candidates AS c
     WHERE c.mark IS NOT NULL AND o.id = c.id AND o.state = 'pending'
    RETURNING o.id, o.apns_id, o.platform, o.topic, o.trap_ids
), superseded_hooks AS (
    -- Webhooks that take `superseded` (schema 11): a delivery per job this claim retired, in this statement.
    INSERT INTO push.webhook_deliveries (webhook_id, event, job_id, body)
    SELECT h.id, 'superseded', e.id,
           jsonb_build_object('job_id', e.id, 'apns_id', e.apns_id, 'platform', e.platform, 'topic', e.topic,
                              'state', 'superseded', 'status', NULL, 'reason', 'Superseded',
                              'trap_ids', to_jsonb(e.trap_ids), 'at', now(), 'event', 'superseded')
      FROM push.webhooks AS h
      JOIN (SELECT * FROM superseded UNION ALL SELECT * FROM below) AS e
        ON h.topic IS NULL OR h.topic = e.topic
     WHERE h.disabled_at IS NULL AND 'superseded' = ANY (h.events)
    RETURNING 1
)
-- Read by position (RowCursor): the claim's own columns, then the job's.
SELECT m.superseded_count, m.limited_ms, m.more,
       (SELECT mk.high_id FROM marks AS mk
         WHERE mk.topic = j.topic AND mk.environment = j.environment AND mk.coalesce_key = j.coalesce_key
           AND mk.high_id > j.id) AS superseded_by,
       (SELECT t.invalidated_at FROM push.invalid_tokens AS t
         WHERE t.platform = j.platform AND t.device_token = j.device_token AND t.topic = j.topic
           AND t.environment = j.environment AND t.invalidated_at > j.created_at) AS token_invalidated_at,
       -- A limited job's send time, as seconds from the moment its schedule was read: the worker counts
       -- them from when it reads the row, so a slow statement delays the send, never advances it.
       s.send_in, s.scope AS send_scope, s.send_interval,
       {{job_columns}}
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
