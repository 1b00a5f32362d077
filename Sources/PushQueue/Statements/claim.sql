-- The claim: one statement takes a batch of due jobs for a worker (JobQueue.claimBatch, JobQueue+Claim.swift,
-- whose ClaimStatement declares the binds in order). Binds: :only_credentials the worker's credentials,
-- :any_credential whether it claims any credential, :excluded_credentials paused credentials,
-- :half_lease_seconds half the lease in seconds, :excluded_environments unreachable environments,
-- :excluded_pairs backing-off environment/credential pairs, :held_ids jobs still held, :include_rate_limited
-- whether rate-limited jobs are taken, :batch_limit the limit, :worker_id the worker, :lease_seconds the lease
-- in seconds, :excluded_topics credential/topic pairs APNs refused (TopicDisallowed), :cursor_credentials,
-- :cursor_environments and :cursor_topics the claimer's cursor (the topic each pair's walk stopped at last),
-- :resume_credentials, :resume_environments, :resume_topics, :resume_priorities, :resume_run_ats and
-- :resume_ids the claimer's resume points (where each busy range's last claim stopped).
-- The rate formula in budgets is push.rate_available (migration 0016), which `push-worker limits` uses too.
--
-- Its cost is bounded by the batch, not by the number of topics, pauses, limits or keys: each pair
-- (credential, environment) walks its topics from the claimer's cursor, at most a batch's worth of topics
-- per claim, and everything per topic is an index probe. Every correlated part is driven from the small
-- side (the walked topics, the candidates, the claimed keys), in a form whose only plans are the bounded
-- ones: no plan may depend on statistics taken when the table looked different (drained, empty, one topic).
-- Claim any credential (tests, tools): the distinct credentials with pending jobs (read only then).
WITH RECURSIVE {{pending_credentials}}, credentials AS (
    SELECT c FROM (
        SELECT unnest(:only_credentials::text[]) AS c WHERE NOT :any_credential
        UNION
        SELECT credential FROM pending_credentials WHERE :any_credential AND credential IS NOT NULL
    ) AS x
     WHERE NOT (c = ANY (:excluded_credentials::text[]))
       -- A pause of a whole credential (or of everything) leaves it out: its backlog is never read.
       AND NOT EXISTS (SELECT 1 FROM push.pauses AS p
                        WHERE p.topic IS NULL AND (p.credential IS NULL OR p.credential = x.c))
), pairs AS MATERIALIZED (
    -- The (credential, environment) pairs still claimable: paused credentials, unreachable
    -- environments and backing-off pools are left out here, so their backlog is never read. Each pair
    -- carries the claimer's cursor: its walk starts after the topic it stopped at last time.
    SELECT c.c, e.environment, coalesce(k.topic, '') AS cursor
      FROM credentials AS c
     -- FCM's jobs have environment 'fcm': its own pairs, its own pauses and backoff.
     CROSS JOIN (VALUES ('production'), ('development'), ('fcm')) AS e(environment)
      LEFT JOIN unnest(:cursor_credentials::text[], :cursor_environments::text[], :cursor_topics::text[])
           AS k(credential, environment, topic)
        ON k.credential = c.c AND k.environment = e.environment
     WHERE NOT (e.environment = ANY (:excluded_environments::text[]))
       AND NOT (e.environment || '/' || c.c = ANY (:excluded_pairs::text[]))
), resume_points AS MATERIALIZED (
    -- The claimer's resume points: where each busy range (credential, environment, topic, priority) goes on,
    -- after the last job its last claim took there. The entries of jobs claimed since the last vacuum lie
    -- before it (a claim's update leaves its pending entry behind), and a probe or a scan from the range's
    -- head would step over every one of them: at a million-job backlog, most of the claim's cost. The due
    -- probes and the range scans below start there. (Microseconds since the epoch: exact both ways.)
    -- (Seconds and microseconds apart: a float product is exact only within 2^53 µs of 1970.)
    SELECT k.credential, k.environment, k.topic, k.priority,
           timestamptz 'epoch' + (k.run_at_us / 1000000) * interval '1 second'
               + (k.run_at_us % 1000000) * interval '1 microsecond' AS after_run_at,
           k.id AS after_id
      FROM unnest(:resume_credentials::text[], :resume_environments::text[], :resume_topics::text[],
                  :resume_priorities::smallint[], :resume_run_ats::bigint[], :resume_ids::bigint[])
           AS k(credential, environment, topic, priority, run_at_us, id)
), resume_topics AS MATERIALIZED (
    -- The same, one row per topic (its three priorities' points side by side): the probes join it once.
    SELECT credential, environment, topic,
           coalesce(max(after_run_at) FILTER (WHERE priority = 10), '-infinity') AS after10_run_at,
           coalesce(max(after_id) FILTER (WHERE priority = 10), 0) AS after10_id,
           coalesce(max(after_run_at) FILTER (WHERE priority = 5), '-infinity') AS after5_run_at,
           coalesce(max(after_id) FILTER (WHERE priority = 5), 0) AS after5_id,
           coalesce(max(after_run_at) FILTER (WHERE priority = 1), '-infinity') AS after1_run_at,
           coalesce(max(after_id) FILTER (WHERE priority = 1), 0) AS after1_id
      FROM resume_points GROUP BY credential, environment, topic
), starts AS MATERIALIZED (
    -- Each pair's first topic with pending jobs after its cursor, else its first topic (the walk wraps
    -- round): one probe of jobs_claim_by_topic_idx, or two.
    -- (With no cursor, nothing after it means nothing at all: no second probe.)
    -- The wrap's probe would step over the claimed entries at the head of the first topic's ranges when
    -- that topic is busy: with a resume point in the pair, it looks only below the pair's first resumed
    -- topic (the hint) and takes the hint when nothing is there. Topics with a resume point are busy ones.
    -- The probe after the cursor likewise looks only below the pair's first resumed topic after the cursor,
    -- and takes that topic when nothing is there.
    SELECT p.c, p.environment, p.cursor,
           coalesce(a.after, CASE WHEN p.cursor <> '' THEN
               CASE WHEN h.hint IS NULL THEN
                   (SELECT j.topic FROM push.jobs AS j
                     WHERE j.state = 'pending' AND j.credential = p.c AND j.environment = p.environment
                     ORDER BY j.topic LIMIT 1)
               ELSE coalesce(
                   (SELECT j.topic FROM push.jobs AS j
                     WHERE j.state = 'pending' AND j.credential = p.c AND j.environment = p.environment
                       AND j.topic < h.hint
                     ORDER BY j.topic LIMIT 1), h.hint) END
           END) AS topic,
           a.after IS NULL AS wrapped, h.hint
      FROM pairs AS p
     CROSS JOIN LATERAL (
        SELECT (SELECT min(k.topic) FROM resume_topics AS k
                 WHERE k.credential = p.c AND k.environment = p.environment) AS hint,
               (SELECT min(k.topic) FROM resume_topics AS k
                 WHERE k.credential = p.c AND k.environment = p.environment AND k.topic > p.cursor) AS next_hint
     ) AS h
     CROSS JOIN LATERAL (
        SELECT CASE WHEN h.next_hint IS NULL THEN
                   (SELECT j.topic FROM push.jobs AS j
                     WHERE j.state = 'pending' AND j.credential = p.c AND j.environment = p.environment
                       AND j.topic > p.cursor
                     ORDER BY j.topic LIMIT 1)
               ELSE coalesce(
                   (SELECT j.topic FROM push.jobs AS j
                     WHERE j.state = 'pending' AND j.credential = p.c AND j.environment = p.environment
                       AND j.topic > p.cursor AND j.topic < h.next_hint
                     ORDER BY j.topic LIMIT 1), h.next_hint) END AS after
     ) AS a
), start_due AS MATERIALIZED (
    -- Whether each pair's first topic has due work (one probe, three when only lower priorities are due).
    -- (From each range's resume point, where it has one.)
    SELECT s.c, s.topic IS NOT NULL AS pending,
           s.topic IS NOT NULL AND coalesce(
               (SELECT true FROM push.jobs AS x
                 WHERE x.state = 'pending' AND x.credential = s.c AND x.environment = s.environment
                   AND x.topic = s.topic AND x.send_priority = 10 AND x.run_at <= now()
                   AND (x.run_at, x.id) > (s.after10_run_at, s.after10_id) LIMIT 1)
               OR (SELECT true FROM push.jobs AS x
                    WHERE x.state = 'pending' AND x.credential = s.c AND x.environment = s.environment
                      AND x.topic = s.topic AND x.send_priority = 5 AND x.run_at <= now()
                      AND (x.run_at, x.id) > (s.after5_run_at, s.after5_id) LIMIT 1)
               OR (SELECT true FROM push.jobs AS x
                    WHERE x.state = 'pending' AND x.credential = s.c AND x.environment = s.environment
                      AND x.topic = s.topic AND x.send_priority = 1 AND x.run_at <= now()
                      AND (x.run_at, x.id) > (s.after1_run_at, s.after1_id) LIMIT 1),
               false) AS due
      FROM (SELECT s.*,
                   coalesce(k.after10_run_at, '-infinity') AS after10_run_at, coalesce(k.after10_id, 0) AS after10_id,
                   coalesce(k.after5_run_at, '-infinity') AS after5_run_at, coalesce(k.after5_id, 0) AS after5_id,
                   coalesce(k.after1_run_at, '-infinity') AS after1_run_at, coalesce(k.after1_id, 0) AS after1_id
              FROM starts AS s
              LEFT JOIN resume_topics AS k
                ON k.credential = s.c AND k.environment = s.environment AND k.topic = s.topic
            -- Kept a subquery (not pulled up), so each probe reads its bounds as parameters.
            OFFSET 0) AS s
), walk_budget AS MATERIALIZED (
    -- How many topics a pair walks in one claim: the batch split among the credentials whose walk starts
    -- at due work (credentials with only retries waiting do not dilute a busy one's walk), at least one;
    -- and at most 32 batches' worth of topics over all the pairs with pending jobs, so a claim's walk stays
    -- bounded by its batch when no walk starts at due work. A credential's topics beyond it wait for the
    -- next claim (it goes on from there).
    SELECT greatest(1, least(
               ceil(:batch_limit::float8 / greatest(count(DISTINCT c) FILTER (WHERE due), 1)),
               ceil(32 * :batch_limit::float8 / greatest(count(*) FILTER (WHERE pending), 1))))::int AS topics
      FROM start_due
), walk AS (
    -- A skip scan of jobs_claim_by_topic_idx from the cursor, one probe per topic, round to the cursor
    -- again or until the pair's budget of topics is spent.
    -- (Its wrap's probe as the start's: below the pair's hint, else the hint.)
    SELECT s.c, s.environment, s.cursor, s.topic, s.wrapped, s.hint, 1 AS n
      FROM starts AS s WHERE s.topic IS NOT NULL
    UNION ALL
    SELECT w.c, w.environment, w.cursor, x.topic, x.wrapped, w.hint, w.n + 1
      FROM walk AS w
     CROSS JOIN LATERAL (
        SELECT coalesce(a.after, CASE WHEN NOT w.wrapped THEN
                   CASE WHEN w.hint IS NULL THEN
                       (SELECT j.topic FROM push.jobs AS j
                         WHERE j.state = 'pending' AND j.credential = w.c AND j.environment = w.environment
                         ORDER BY j.topic LIMIT 1)
                   ELSE coalesce(
                       (SELECT j.topic FROM push.jobs AS j
                         WHERE j.state = 'pending' AND j.credential = w.c AND j.environment = w.environment
                           AND j.topic < w.hint
                         ORDER BY j.topic LIMIT 1), w.hint) END
               END) AS topic,
               w.wrapped OR a.after IS NULL AS wrapped
          FROM (SELECT CASE WHEN n.next_hint IS NULL THEN
                           (SELECT j.topic FROM push.jobs AS j
                             WHERE j.state = 'pending' AND j.credential = w.c AND j.environment = w.environment
                               AND j.topic > w.topic
                             ORDER BY j.topic LIMIT 1)
                       ELSE coalesce(
                           (SELECT j.topic FROM push.jobs AS j
                             WHERE j.state = 'pending' AND j.credential = w.c AND j.environment = w.environment
                               AND j.topic > w.topic AND j.topic < n.next_hint
                             ORDER BY j.topic LIMIT 1), n.next_hint) END AS after
                  FROM (SELECT CASE WHEN w.hint IS NULL THEN NULL ELSE
                               (SELECT min(k.topic) FROM resume_topics AS k
                                 WHERE k.credential = w.c AND k.environment = w.environment AND k.topic > w.topic)
                               END AS next_hint) AS n) AS a
        -- Kept a subquery (not pulled up), so each probe runs once, not again in the filter below.
        OFFSET 0
     ) AS x
     WHERE w.n < (SELECT topics FROM walk_budget) AND NOT (w.wrapped AND w.topic >= w.cursor)
       AND x.topic IS NOT NULL AND NOT (x.wrapped AND x.topic > w.cursor)
), cursors AS MATERIALIZED (
    -- Where each pair's walk stopped: the claimer's cursor for its next claim.
    SELECT DISTINCT ON (c, environment) c, environment, topic, n FROM walk ORDER BY c, environment, n DESC
), controls AS MATERIALIZED (
    -- Whether any pause or limit exists: with none, no topic probes for them.
    SELECT EXISTS (SELECT 1 FROM push.pauses WHERE topic IS NOT NULL) AS topic_pauses,
           EXISTS (SELECT 1 FROM push.rate_limits) AS limits
), scoped AS MATERIALIZED (
    -- Each walked topic with its limit, the most specific that matches (credential and topic, the
    -- credential, the topic, everything), by probes of the limits' unique index; paused topics left out
    -- (probes of the pauses' unique index).
    SELECT w.c, w.environment, w.topic,
           CASE WHEN (SELECT limits FROM controls) THEN
               coalesce((SELECT l.id FROM push.rate_limits AS l WHERE l.credential = w.c AND l.topic = w.topic),
                        (SELECT l.id FROM push.rate_limits AS l WHERE l.credential = w.c AND l.topic IS NULL),
                        (SELECT l.id FROM push.rate_limits AS l WHERE l.credential IS NULL AND l.topic = w.topic),
                        (SELECT l.id FROM push.rate_limits AS l WHERE l.credential IS NULL AND l.topic IS NULL))
           END AS scope
      FROM walk AS w
     -- Topic pauses are APNs' (TopicDisallowed): an Android app's jobs of the same id go on.
     WHERE NOT (w.environment <> 'fcm' AND w.c || '/' || w.topic = ANY (:excluded_topics::text[]))
       AND CASE WHEN (SELECT topic_pauses FROM controls) THEN
               NOT EXISTS (SELECT 1 FROM push.pauses AS p WHERE p.credential = w.c AND p.topic = w.topic)
               AND NOT EXISTS (SELECT 1 FROM push.pauses AS p WHERE p.credential IS NULL AND p.topic = w.topic)
           ELSE true END
), held_limits AS MATERIALIZED (
    -- The fleet's send schedules this claim uses, locked, read after the lock. SKIP LOCKED: a schedule
    -- another claimer holds right now counts as full for this claim (its jobs wait for the next claim),
    -- so claimers never queue on the limits and no worker over-claims. Only the limits of the walked
    -- topics are locked; a claim that leaves limited jobs for later (:include_rate_limited false) locks none.
    SELECT l.id, l.next_send_at FROM push.rate_limits AS l
     WHERE :include_rate_limited AND l.id = ANY (ARRAY(SELECT DISTINCT scope FROM scoped WHERE scope IS NOT NULL))
     ORDER BY l.id FOR UPDATE SKIP LOCKED
), budgets AS MATERIALIZED (
    -- A limit takes jobs while their send times (one interval apart, from its tail or now) fall within
    -- the look-ahead of now: burst intervals, at most half the lease but never less than one
    -- interval, so any rate sends, however slow. Times are clock_timestamp(), taken after the lock.
    SELECT l.id, l.credential, l.topic, l.per_second, t.start, t.at, h.id IS NOT NULL AS held,
           CASE WHEN h.id IS NULL THEN 0
                ELSE push.rate_available(l.per_second, l.burst, extract(epoch FROM t.start - t.at),
                                         :half_lease_seconds) END AS available
      FROM (SELECT id, credential, topic, per_second::float8 AS per_second, burst::float8 AS burst,
                   next_send_at FROM push.rate_limits
             WHERE id = ANY (ARRAY(SELECT DISTINCT scope FROM scoped WHERE scope IS NOT NULL))) AS l
      LEFT JOIN held_limits AS h ON h.id = l.id
     CROSS JOIN LATERAL (SELECT greatest(coalesce(h.next_send_at, l.next_send_at), c.at) AS start, c.at
                           FROM (SELECT clock_timestamp() AS at) AS c) AS t
), topic_due AS MATERIALIZED (
    -- Which priorities of each walked topic have due work: a probe for priority 10, a probe for any
    -- pending job below it, and only then one each for 5 and 1 (most topics send at 10 alone: two probes).
    -- Scalar probes, not EXISTS: the planner turns EXISTS into a semi-join over the whole index.
    -- (From each range's resume point, where it has one.)
    SELECT t.c, t.environment, t.topic, t.scope, d.d10, lo.d5, lo.d1
      FROM (SELECT t.*,
                   coalesce(k.after10_run_at, '-infinity') AS after10_run_at, coalesce(k.after10_id, 0) AS after10_id,
                   coalesce(k.after5_run_at, '-infinity') AS after5_run_at, coalesce(k.after5_id, 0) AS after5_id,
                   coalesce(k.after1_run_at, '-infinity') AS after1_run_at, coalesce(k.after1_id, 0) AS after1_id
              FROM scoped AS t
              LEFT JOIN resume_topics AS k
                ON k.credential = t.c AND k.environment = t.environment AND k.topic = t.topic
            OFFSET 0) AS t
     CROSS JOIN LATERAL (
        SELECT coalesce((SELECT true FROM push.jobs AS x
                          WHERE x.state = 'pending' AND x.credential = t.c AND x.environment = t.environment
                            AND x.topic = t.topic AND x.send_priority = 10 AND x.run_at <= now()
                            AND (x.run_at, x.id) > (t.after10_run_at, t.after10_id) LIMIT 1), false) AS d10,
               -- (A resume point at 5 or 1 says so without the probe, which would start at their heads.)
               CASE WHEN t.after5_id > 0 OR t.after1_id > 0 THEN true
                    ELSE coalesce((SELECT true FROM push.jobs AS x
                                    WHERE x.state = 'pending' AND x.credential = t.c
                                      AND x.environment = t.environment AND x.topic = t.topic
                                      AND x.send_priority < 10 LIMIT 1), false) END AS low
        OFFSET 0
     ) AS d
     CROSS JOIN LATERAL (
        SELECT d.low AND coalesce((SELECT true FROM push.jobs AS x
                    WHERE x.state = 'pending' AND x.credential = t.c AND x.environment = t.environment
                      AND x.topic = t.topic AND x.send_priority = 5 AND x.run_at <= now()
                      AND (x.run_at, x.id) > (t.after5_run_at, t.after5_id) LIMIT 1), false) AS d5,
               d.low AND coalesce((SELECT true FROM push.jobs AS x
                    WHERE x.state = 'pending' AND x.credential = t.c AND x.environment = t.environment
                      AND x.topic = t.topic AND x.send_priority = 1 AND x.run_at <= now()
                      AND (x.run_at, x.id) > (t.after1_run_at, t.after1_id) LIMIT 1), false) AS d1
        OFFSET 0
     ) AS lo
), topic_ranges AS MATERIALIZED (
    -- Each walked (credential, environment, topic) with due work that may take jobs now: a topic with
    -- nothing due is not read, and a credential with nothing due takes no share of the batch; a limit with
    -- no room is left out here, as a whole range: its backlog is never read.
    SELECT t.c AS credential, t.environment, t.topic, t.scope, b.available, t.d10, t.d5, t.d1
      FROM topic_due AS t
      LEFT JOIN budgets AS b ON b.id = t.scope
     WHERE (t.scope IS NULL OR (:include_rate_limited AND b.available >= 1)) AND (t.d10 OR t.d5 OR t.d1)
), ranges AS MATERIALIZED (
    -- Every (credential, environment, topic, priority) with due work to read. Each credential with due work
    -- takes an equal share of the batch, split among its topics with due work at that priority (a
    -- configured credential with nothing due takes none); a limited topic reads no more than its limit's room.
    -- A range this claimer's last claim of it left with more to take starts at its resume point.
    SELECT r.credential, r.environment, r.topic, r.scope, p.priority, p.weight,
           least(ceil(:batch_limit::float8 / (SELECT count(DISTINCT credential) FROM topic_ranges)
                      / count(*) OVER (PARTITION BY r.credential, p.priority)),
                 coalesce(floor(r.available), :batch_limit::float8))::bigint AS share,
           coalesce(k.after_run_at, '-infinity') AS after_run_at, coalesce(k.after_id, 0) AS after_id
      FROM topic_ranges AS r
     CROSS JOIN (VALUES (10::smallint, 8.0::float8), (5::smallint, 2.0::float8), (1::smallint, 1.0::float8))
           AS p(priority, weight)
      LEFT JOIN resume_points AS k
        ON k.credential = r.credential AND k.environment = r.environment AND k.topic = r.topic
       AND k.priority = p.priority
     WHERE CASE p.priority WHEN 10 THEN r.d10 WHEN 5 THEN r.d5 ELSE r.d1 END
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
           -- From the range's resume point (or its head): an index condition, not a filter.
           AND (j.run_at, j.id) > (r.after_run_at, r.after_id)
           AND (cardinality(:held_ids::bigint[]) = 0 OR NOT (j.id = ANY (:held_ids::bigint[])))
           -- Latest wins: a job with a newer due pending job of the same key (same topic and
           -- environment) is not claimable (a newer one another claimer holds right now counts too:
           -- it is still pending here).
           -- A probe of jobs_coalesce_scope_idx. Its state test is written as that index's predicate is
           -- (schema 13): the planner can use no other partial index of pending jobs for it.
           AND (j.coalesce_key IS NULL OR m.high_id > j.id OR (
                SELECT true FROM push.jobs AS n
                 WHERE n.coalesce_key = j.coalesce_key AND n.topic = j.topic AND n.environment = j.environment
                   AND n.state >= 'pending' AND n.state <= 'pending' AND n.id > j.id AND n.run_at <= now()
                 ORDER BY n.coalesce_key, n.topic, n.environment, n.id LIMIT 1) IS NULL)
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
), resumes AS MATERIALIZED (
    -- Each range read that has a point or had one: where its next claim by this claimer starts. After the
    -- last job taken there when the range gave its whole share (more is likely waiting behind it: the jobs it
    -- locked but did not take lie after that job in the range's order); from its head (0) when it gave less,
    -- so a job the scan passed (locked by another statement then, or enqueued with a run_at already past) is
    -- found again.
    -- (Grouped once, not probed per range: a claim over 250 topics has 250 ranges.)
    SELECT r.credential, r.environment, r.topic, r.priority,
           -- (0 for "from its head": arrays of the claim's answer carry no NULL.)
           -- Only a range with a share of 8 or more: a deep backlog's claims read few ranges, each a large
           -- share; a claim over many topics keeps no points it would have to join (at most 32 a claim).
           coalesce(CASE WHEN g.n >= r.share AND r.share >= 8
                         THEN (extract(epoch FROM l.run_at) * 1000000)::bigint END, 0) AS run_at_us,
           coalesce(CASE WHEN g.n >= r.share AND r.share >= 8 THEN l.id END, 0) AS id
      FROM ranges AS r
      LEFT JOIN (SELECT c.credential, c.environment, c.topic, c.send_priority, count(*) AS n FROM candidates AS c
                  GROUP BY c.credential, c.environment, c.topic, c.send_priority) AS g
        ON g.credential = r.credential AND g.environment = r.environment AND g.topic = r.topic
       AND g.send_priority = r.priority
      LEFT JOIN (SELECT DISTINCT ON (c.credential, c.environment, c.topic, c.send_priority)
                        c.credential, c.environment, c.topic, c.send_priority, c.run_at, c.id
                   FROM candidates AS c JOIN picked AS p ON p.id = c.id
                  ORDER BY c.credential, c.environment, c.topic, c.send_priority, c.run_at DESC, c.id DESC) AS l
        ON l.credential = r.credential AND l.environment = r.environment AND l.topic = r.topic
       AND l.send_priority = r.priority
     -- Only what changes the claimer's points: a new point, or "from its head" for a range it sent a point for
     -- (a claim over 250 topics would otherwise send 250 rows of nothing back, decoded on every claim).
     WHERE (g.n >= r.share AND r.share >= 8 AND l.id IS NOT NULL) OR r.after_id > 0
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
), superseded_targets AS MATERIALIZED (
    -- Latest wins: the older pending jobs of each claimed job's key, found from the claimed keys (none
    -- claimed: nothing read), one range of jobs_coalesce_scope_idx each: the state test is written as that
    -- index's predicate is (schema 13), so no other partial index of pending jobs can serve it. Rows another
    -- statement holds are skipped: they meet the mark when they are next claimable. Locked here, so the
    -- update below needs no state test (one would let the planner drive it from a pending index instead of
    -- these ids).
    SELECT s.id, c.id AS by
      FROM (SELECT id, topic, environment, coalesce_key FROM claimed WHERE coalesce_key IS NOT NULL) AS c
     CROSS JOIN LATERAL (
        SELECT o.id FROM push.jobs AS o
         WHERE o.coalesce_key = c.coalesce_key AND o.topic = c.topic AND o.environment = c.environment
           AND o.state >= 'pending' AND o.state <= 'pending' AND o.id < c.id
         ORDER BY o.coalesce_key, o.topic, o.environment, o.id
         -- Bounded: a key's older backlog beyond this is superseded as its ranges are read (below its
         -- mark), a share at a time, never in one statement that could outlast the statement deadline.
         LIMIT 1000
         FOR NO KEY UPDATE OF o SKIP LOCKED
     ) AS s
     WHERE NOT (s.id = ANY (ARRAY(SELECT id FROM candidates WHERE mark IS NOT NULL)))
), superseded AS (
    -- The older jobs of a claimed job's key end here, never sent, whatever they were doing (waiting,
    -- scheduled for a retry, returned by the reaper); a running one completes.
    UPDATE push.jobs AS o
       -- No history entry: superseded_by says it all, and a large backlog is cheaper to retire.
       SET state = 'superseded', superseded_by = t.by, reason = 'Superseded', locked_by = NULL,
           locked_until = NULL
      FROM superseded_targets AS t
     WHERE o.id = t.id
    RETURNING o.id, o.apns_id, o.platform, o.topic, o.trap_ids
), below AS (
    -- Jobs of this claim's ranges already below their key's mark (locked by candidates: still pending).
    UPDATE push.jobs AS o
       SET state = 'superseded', superseded_by = c.mark, reason = 'Superseded', locked_by = NULL,
           locked_until = NULL
      FROM candidates AS c
     WHERE c.mark IS NOT NULL AND o.id = c.id
    RETURNING o.id, o.apns_id, o.platform, o.topic, o.trap_ids
), superseded_hooks AS (
    -- Webhooks that take `superseded` (schema 11): a delivery per job this claim retired, in this statement.
    INSERT INTO push.webhook_deliveries (webhook_id, event, job_id, body)
    SELECT h.id, 'superseded', e.id, {{webhook_delivery_body}}
      FROM push.webhooks AS h
      JOIN (SELECT s.*, 'superseded' AS state, NULL::smallint AS status, 'Superseded' AS reason,
                   'superseded' AS event
              FROM (SELECT * FROM superseded UNION ALL SELECT * FROM below) AS s) AS e
        ON h.topic IS NULL OR h.topic = e.topic
     WHERE h.disabled_at IS NULL AND 'superseded' = ANY (h.events)
    RETURNING 1
)
-- Read by position (RowCursor): the claim's own columns, then the job's.
-- The cursor comes once, on the first row (three arrays of a pair each, on every row, cost the worker more
-- to decode than the job at a hundred credentials).
SELECT m.superseded_count, m.limited_ms, m.more, m.walk_cut,
       CASE WHEN row_number() OVER () = 1 THEN m.cursor_credentials END,
       CASE WHEN row_number() OVER () = 1 THEN m.cursor_environments END,
       CASE WHEN row_number() OVER () = 1 THEN m.cursor_topics END,
       CASE WHEN row_number() OVER () = 1 THEN m.resume_credentials END,
       CASE WHEN row_number() OVER () = 1 THEN m.resume_environments END,
       CASE WHEN row_number() OVER () = 1 THEN m.resume_topics END,
       CASE WHEN row_number() OVER () = 1 THEN m.resume_priorities END,
       CASE WHEN row_number() OVER () = 1 THEN m.resume_run_ats END,
       CASE WHEN row_number() OVER () = 1 THEN m.resume_ids END,
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
                       HAVING count(*) >= c.share) AS more,
               -- A walk that spent its budget of topics: the pair's next topics wait their turn.
               EXISTS (SELECT 1 FROM cursors WHERE n >= (SELECT topics FROM walk_budget)) AS walk_cut,
               ARRAY(SELECT c FROM cursors ORDER BY c, environment) AS cursor_credentials,
               ARRAY(SELECT environment FROM cursors ORDER BY c, environment) AS cursor_environments,
               ARRAY(SELECT topic FROM cursors ORDER BY c, environment) AS cursor_topics,
               ARRAY(SELECT credential FROM resumes ORDER BY credential, environment, topic, priority)
                   AS resume_credentials,
               ARRAY(SELECT environment FROM resumes ORDER BY credential, environment, topic, priority)
                   AS resume_environments,
               ARRAY(SELECT topic FROM resumes ORDER BY credential, environment, topic, priority) AS resume_topics,
               ARRAY(SELECT priority FROM resumes ORDER BY credential, environment, topic, priority)
                   AS resume_priorities,
               ARRAY(SELECT run_at_us FROM resumes ORDER BY credential, environment, topic, priority)
                   AS resume_run_ats,
               ARRAY(SELECT id FROM resumes ORDER BY credential, environment, topic, priority) AS resume_ids) AS m
  LEFT JOIN claimed AS j ON true
  -- Joined once (a hash join), not a subquery per row: picked has a row per claimed job.
  LEFT JOIN (SELECT p.id, p.scope, extract(epoch FROM b.start - b.at)::float8 + (p.k - 1) / b.per_second AS send_in,
                    1 / b.per_second AS send_interval
               FROM picked AS p JOIN budgets AS b ON b.id = p.scope) AS s ON s.id = j.id
 ORDER BY j.send_priority DESC, j.run_at, j.id
