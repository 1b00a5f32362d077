-- push.jobs, besides the claim (claim.sql) and the outcome write (write_outcomes.sql): what a worker does to
-- the jobs it holds, what the CLI reads of them, and the prunes of finished rows and spent ids
-- (JobQueue+Claim.swift, JobQueue+Leases.swift, JobQueue+Inspect.swift).
-- Each statement starts at its `-- name:` line; the comment lines right after it describe it.

-- name: supersede_claimed
-- Ends claimed jobs superseded without a request (a newer job of their key was claimed by another worker
-- while this claim ran), fenced on (id, attempt, worker), the attempt not counted; webhooks told.
WITH superseded AS (
    UPDATE push.jobs AS j
       SET state = 'superseded', superseded_by = i.by, reason = 'Superseded', attempts = j.attempts - 1,
           locked_by = NULL, locked_until = NULL
      FROM unnest(:ids::bigint[], :attempts::smallint[], :by::bigint[]) AS i(id, attempt, by)
     WHERE j.id = i.id AND j.attempts = i.attempt AND j.locked_by = :worker_id AND j.state = 'running'
    RETURNING j.id, j.apns_id, j.platform, j.topic, j.trap_ids
), hooks AS (
    -- Webhooks that take `superseded` (schema 11), as the claim's own superseding does.
    INSERT INTO push.webhook_deliveries (webhook_id, event, job_id, body)
    SELECT h.id, 'superseded', e.id, {{webhook_delivery_body}}
      FROM push.webhooks AS h
      JOIN (SELECT s.*, 'superseded' AS state, NULL::smallint AS status, 'Superseded' AS reason,
                   'superseded' AS event
              FROM superseded AS s) AS e
        ON h.topic IS NULL OR h.topic = e.topic
     WHERE h.disabled_at IS NULL AND 'superseded' = ANY (h.events)
    RETURNING 1
)
SELECT id FROM superseded

-- name: until_next_due
-- Milliseconds until the next pending job falls due (negative: one is due), NULL when none is pending.
SELECT (extract(epoch FROM ({{earliest_pending_run_at}} - now())) * 1000)::bigint

-- name: release
-- Claimed jobs never sent back to pending as if never claimed (the attempt not counted, run_at kept).
UPDATE push.jobs AS j
   SET state = 'pending', attempts = j.attempts - 1, locked_by = NULL, locked_until = NULL
  FROM unnest(:ids::bigint[], :attempts::smallint[]) AS i(id, attempt)
 WHERE j.id = i.id AND j.attempts = i.attempt AND j.locked_by = :worker_id
RETURNING j.id

-- name: extend_leases
-- The leases of jobs this worker still holds; a row another statement holds now is skipped (next beat).
UPDATE push.jobs SET locked_until = now() + make_interval(secs => :lease_seconds)
 WHERE id IN (SELECT id FROM push.jobs WHERE id = ANY (:ids::bigint[]) AND locked_by = :worker_id
               ORDER BY id FOR NO KEY UPDATE SKIP LOCKED)
   AND locked_by = :worker_id
RETURNING id

-- name: prune_finished
-- Delivered, superseded, cancelled and fanned-out jobs past the retention, at most :batch_size of each a statement.
WITH delivered AS (
    SELECT id FROM push.jobs
     WHERE state = 'delivered' AND delivered_at < now() - make_interval(secs => :retention_seconds)
     LIMIT :batch_size
     FOR UPDATE SKIP LOCKED
), superseded AS (
    -- Superseded jobs (never sent) go by the same retention, counted from their creation.
    SELECT id FROM push.jobs
     WHERE state = 'superseded' AND created_at < now() - make_interval(secs => :retention_seconds)
     LIMIT :batch_size
     FOR UPDATE SKIP LOCKED
), cancelled AS (
    -- Cancelled jobs too (a holder's late outcome is no longer awaited after the retention).
    SELECT id FROM push.jobs
     WHERE state = 'cancelled' AND created_at < now() - make_interval(secs => :retention_seconds)
     LIMIT :batch_size
     FOR UPDATE SKIP LOCKED
), fanned_out AS (
    -- Recipients' jobs that fanned out (their children are jobs of their own): jobs_fanned_out_idx.
    SELECT id FROM push.jobs
     WHERE state = 'fanned_out' AND created_at < now() - make_interval(secs => :retention_seconds)
     LIMIT :batch_size
     FOR UPDATE SKIP LOCKED
)
-- The apns_id stays spent in push.apns_ids: an outbox retry of this job is skipped, not sent again.
DELETE FROM push.jobs
 WHERE id IN (SELECT id FROM delivered UNION ALL SELECT id FROM superseded
              UNION ALL SELECT id FROM cancelled UNION ALL SELECT id FROM fanned_out)
RETURNING id

-- name: forget_apns_ids
-- apns_ids enqueued before the age that no job and no dead letter holds any longer.
DELETE FROM push.apns_ids WHERE apns_id IN (
    SELECT a.apns_id FROM push.apns_ids AS a
     WHERE a.created_at < now() - make_interval(secs => :age_seconds)
       AND NOT EXISTS (SELECT 1 FROM push.jobs AS j WHERE j.apns_id = a.apns_id)
       AND NOT EXISTS (SELECT 1 FROM push.dead_jobs AS d WHERE d.apns_id = a.apns_id)
     LIMIT :batch_size FOR UPDATE SKIP LOCKED)
RETURNING 1

-- name: forget_retired_apns_ids
-- The retired apns_ids of schema 4 to 7, past the age.
DELETE FROM push.retired_apns_ids WHERE apns_id IN (
    SELECT apns_id FROM push.retired_apns_ids
     WHERE retired_at < now() - make_interval(secs => :age_seconds)
     LIMIT :batch_size FOR UPDATE SKIP LOCKED)
RETURNING 1

-- name: forget_coalesce_marks
-- The latest-wins marks of keys not claimed for the age, read through coalesce_marks_updated_idx (schema
-- 14): only the marks it deletes.
DELETE FROM push.coalesce_marks WHERE (topic, environment, coalesce_key) IN (
    SELECT topic, environment, coalesce_key FROM push.coalesce_marks
     WHERE updated_at < now() - make_interval(secs => :age_seconds)
     LIMIT :batch_size FOR UPDATE SKIP LOCKED)
RETURNING 1

-- name: show
-- One job with its outcome, its history as shown and its whole row.
SELECT {{job_columns}}, j.state, j.status, j.reason, j.apns_unique_id, j.delivered_at,
       j.last_attempt_at, j.latency_ms, j.locked_by, j.locked_until, j.superseded_by,
       j.provider_message_id,
       {{shown_history}}::text AS history_json,
       (to_jsonb(j) - 'send_priority' || jsonb_build_object('history', {{shown_history}}))::text AS row_json
  FROM push.jobs AS j WHERE j.id = :id

-- name: claimed_children
-- The children a fan-out just claimed for :worker_id (of the ids :ids, those it inserted `running`), read as
-- a claim returns its jobs.
SELECT {{job_columns}}
  FROM push.jobs AS j
 WHERE j.id = ANY (:ids::bigint[]) AND j.state = 'running' AND j.locked_by = :worker_id AND j.attempts = 1
 ORDER BY j.id

-- name: children
-- The children of the recipient's job :id, in id order: each with its state (`dead` once a dead letter, gone
-- when pruned), fingerprinted by the caller, its environment and its reason.
SELECT c.id, coalesce(j.state, CASE WHEN d.id IS NOT NULL THEN 'dead' ELSE 'pruned' END),
       coalesce(j.device_token, d.device_token), coalesce(j.environment, d.environment),
       coalesce(j.reason, d.reason)
  FROM unnest((SELECT p.children FROM push.jobs AS p WHERE p.id = :id)) AS c (id)
  LEFT JOIN push.jobs AS j ON j.id = c.id
  LEFT JOIN push.dead_jobs AS d ON d.id = c.id
 ORDER BY c.id

-- name: stats
-- Counts by platform and state, the oldest due job's age, dead letters by trap, the last minute's throughput.
SELECT
  (SELECT coalesce(jsonb_object_agg(platform || '/' || state, n), '{}')::text
     FROM (SELECT platform, state, count(*) AS n FROM push.jobs GROUP BY platform, state) AS s),
  (SELECT count(*) FROM push.jobs WHERE state = 'pending' AND run_at <= now()),
  (SELECT coalesce(extract(epoch FROM now() - min(run_at)), 0)::double precision
     FROM push.jobs WHERE state = 'pending' AND run_at <= now()),
  (SELECT count(*) FROM push.dead_jobs),
  (SELECT coalesce(jsonb_object_agg(trap, n), '{}')::text FROM (
      SELECT coalesce(t.trap, 'none') AS trap, count(*) AS n
        FROM push.dead_jobs AS d LEFT JOIN LATERAL unnest(d.trap_ids) AS t(trap) ON true
       GROUP BY 1) AS x),
  (SELECT count(*) FROM push.jobs
    WHERE state = 'delivered' AND delivered_at > now() - interval '1 minute'),
  (SELECT count(*) FROM push.dead_jobs WHERE dead_at > now() - interval '1 minute'),
  (SELECT count(*) FROM push.invalid_tokens)

-- name: gauges
-- The queue gauges, for the live worker with the smallest id only (no row for any other): pending and running
-- from their partial indexes, the oldest due job one probe per claim range, never a delivered row.
SELECT (SELECT count(*) FROM push.jobs WHERE state = 'pending'),
       (SELECT count(*) FROM push.jobs WHERE state = 'running'),
       -- The oldest due job is the earliest pending one, if that is due.
       greatest(coalesce(extract(epoch FROM now() - {{earliest_pending_run_at}}), 0), 0)::double precision,
       (SELECT CASE WHEN c.reltuples < 100000 THEN (SELECT count(*) FROM push.dead_jobs)
                    ELSE c.reltuples::bigint END
          FROM pg_class AS c WHERE c.oid = 'push.dead_jobs'::regclass),
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
            'credential', credential, 'topic', topic, 'reason', reason,
            'created_at', extract(epoch FROM created_at), 'created_by', created_by)), '[]')::text
          FROM push.pauses),
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
            'credential', credential, 'topic', topic, 'per_second', per_second::float8, 'burst', burst,
            'available', {{available_now}})), '[]')::text
          FROM push.rate_limits),
       -- Per enabled hook, its oldest due delivery through the claim index (a disabled hook's backlog is
       -- never read).
       greatest(coalesce(extract(epoch FROM now() - (
           SELECT min(x.run_at) FROM push.webhooks AS w CROSS JOIN LATERAL (
               SELECT d.run_at FROM push.webhook_deliveries AS d
                WHERE d.webhook_id = w.id AND d.state IN ('pending', 'running') AND d.run_at <= now()
                  AND (d.state = 'pending' OR d.locked_until < now())
                ORDER BY d.run_at LIMIT 1) AS x
            WHERE w.disabled_at IS NULL)), 0), 0)::double precision
 WHERE (SELECT min(worker_id) FROM push.workers
         WHERE stopped_at IS NULL AND heartbeat_at > now() - make_interval(secs => :stale_seconds))
       = :worker_id

-- name: overview
-- The console's counts by state and the oldest due job's age: partial indexes, counts capped at :cap and the
-- planner's estimates, so it stays fast with millions of delivered rows.
SELECT (SELECT count(*) FROM (SELECT 1 FROM push.jobs WHERE state = 'pending' AND run_at <= now() LIMIT :cap) AS x),
       (SELECT count(*) FROM (SELECT 1 FROM push.jobs WHERE state = 'pending' AND run_at > now() LIMIT :cap) AS x),
       (SELECT count(*) FROM (SELECT 1 FROM push.jobs WHERE state = 'running' LIMIT :cap) AS x),
       (SELECT count(*) FROM (SELECT 1 FROM push.jobs WHERE state = 'delivered' LIMIT :cap) AS x),
       (SELECT reltuples::float8 FROM pg_class WHERE oid = 'push.jobs_delivered_idx'::regclass),
       (SELECT count(*) FROM (SELECT 1 FROM push.jobs WHERE state = 'superseded' LIMIT :cap) AS x),
       (SELECT reltuples::float8 FROM pg_class WHERE oid = 'push.jobs_superseded_idx'::regclass),
       (SELECT count(*) FROM (SELECT 1 FROM push.dead_jobs LIMIT :cap) AS x),
       (SELECT reltuples::float8 FROM pg_class WHERE oid = 'push.dead_jobs'::regclass),
       greatest(coalesce(extract(epoch FROM now() - {{earliest_pending_run_at}}), 0), 0)::float8

-- name: outcomes_by_minute
-- Deliveries and dead letters per minute over the last :minutes minutes, oldest first, every minute present,
-- from the delivered and dead-at indexes: the cost follows the window's volume, not the table's size.
WITH minutes AS (
    SELECT generate_series(date_trunc('minute', now()) - make_interval(mins => :minutes - 1),
                           date_trunc('minute', now()), interval '1 minute') AS minute
), delivered AS (
    SELECT date_trunc('minute', delivered_at) AS minute, count(*) AS n FROM push.jobs
     WHERE state = 'delivered'
       AND delivered_at >= date_trunc('minute', now()) - make_interval(mins => :minutes - 1)
     GROUP BY 1
), dead AS (
    SELECT date_trunc('minute', dead_at) AS minute, count(*) AS n FROM push.dead_jobs
     WHERE dead_at >= date_trunc('minute', now()) - make_interval(mins => :minutes - 1)
     GROUP BY 1
)
SELECT m.minute, coalesce(d.n, 0), coalesce(x.n, 0)
  FROM minutes AS m LEFT JOIN delivered AS d USING (minute) LEFT JOIN dead AS x USING (minute)
 ORDER BY m.minute

-- name: write_unwritable
-- The last resort for one outcome the normal write refused (a poison row): a 200 written as delivered with
-- nothing else; anything else moves the job to the dead letters with :sentence, without the side effect that
-- may have failed (the invalid-token row). Fenced like the normal write; webhooks told in the same statement.
WITH done AS (
    UPDATE push.jobs AS j
       SET state = 'delivered', delivered_at = now(), last_attempt_at = now(), status = 200,
           locked_by = NULL, locked_until = NULL
     WHERE :delivered AND j.id = :id AND j.attempts = :attempt AND j.locked_by = :worker_id
    RETURNING j.id, j.apns_id, j.platform, j.topic, j.trap_ids
), moved AS (
    DELETE FROM push.jobs AS j
     WHERE NOT :delivered AND j.id = :id AND j.attempts = :attempt AND j.locked_by = :worker_id
    RETURNING j.*
), dead AS (
    INSERT INTO push.dead_jobs ({{dead_letter_columns}})
    SELECT id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
           collapse_id, expires_at, run_at, apns_id, max_attempts, attempts, transport_retries,
           :status::smallint, :reason::text, coalesce(array_remove(trap_ids, NULL), '{}'), apns_unique_id,
           created_at, first_attempt_at, now(), NULL, now(), :sentence::text,
           history || jsonb_build_array(:entry::jsonb || jsonb_build_object('at', now(), 'worker', :worker_id::text)),
           deliver_once, coalesce_key, platform, provider_message_id, traceparent, trace_first_span, recipient,
           parent_id, auto_environment, activity_id
      FROM moved
    {{dead_conflict}}
    RETURNING id
), deliveries AS (
    -- Webhooks take this outcome too, in the same statement (the normal write's rule).
    INSERT INTO push.webhook_deliveries (webhook_id, event, job_id, body)
    SELECT h.id, e.event, e.id, {{webhook_delivery_body}}
      FROM push.webhooks AS h
      JOIN (SELECT id, 'delivered' AS event, 'delivered' AS state, apns_id, platform, topic, 200 AS status,
                   NULL::text AS reason, trap_ids
              FROM done
            UNION ALL
            SELECT id, 'dead', 'dead', apns_id, platform, topic, :status::int, :reason::text, trap_ids
              FROM moved) AS e
        ON e.event = ANY (h.events) AND (h.topic IS NULL OR h.topic = e.topic)
     WHERE h.disabled_at IS NULL
    RETURNING 1
)
SELECT id FROM done UNION ALL SELECT id FROM dead

-- name: mark_internal_insert
-- This transaction's inserts are the worker's own (a replay, a revive): the producers' INSERT trigger keeps
-- the row's worker columns and lets a held apns_id through.
SELECT set_config('push.internal_insert', 'on', true)

-- name: lock_superseded
-- The superseded jobs a revive asks for, locked first (a worker's claim skips them), then assessed.
SELECT id FROM push.jobs WHERE id = ANY (:ids::bigint[]) AND state = 'superseded' FOR UPDATE

-- name: assess_revive
-- For each asked-for job: its state, the newest claimed job of its key (the mark, or the job that superseded
-- it when the mark was forgotten), whether that one died unsent (a dead letter, and the job that superseded
-- this one is still kept: not delivered and pruned since), and the newest job of the key that is or will be
-- sent.
SELECT a.id, j.state, j.apns_id, j.expires_at < now() AS expired, newest.id AS newest,
       EXISTS (SELECT 1 FROM push.dead_jobs AS d WHERE d.id = newest.id)
       AND (EXISTS (SELECT 1 FROM push.dead_jobs AS d WHERE d.id = j.superseded_by)
            OR EXISTS (SELECT 1 FROM push.jobs AS s WHERE s.id = j.superseded_by
                        AND s.state IN ('superseded', 'cancelled'))) AS newest_dead,
       blocker.id, blocker.state
  FROM unnest(:ids::bigint[]) AS a (id)
  LEFT JOIN push.jobs AS j ON j.id = a.id
  LEFT JOIN push.coalesce_marks AS m
    ON m.topic = j.topic AND m.environment = j.environment AND m.coalesce_key = j.coalesce_key
  LEFT JOIN LATERAL (SELECT greatest(m.high_id, j.superseded_by) AS id) AS newest ON true
  LEFT JOIN LATERAL (
    SELECT n.id, n.state FROM push.jobs AS n
     WHERE n.coalesce_key = j.coalesce_key AND n.topic = j.topic AND n.environment = j.environment
       AND n.id > j.id AND n.state IN ('pending', 'running', 'delivered')
     ORDER BY n.id DESC LIMIT 1
  ) AS blocker ON true

-- name: revive
-- Queues the superseded jobs :ids again under new ids, in id order so that the new ids keep their order,
-- due now, their apns_id kept (never sent), their history plus a `revived` entry; returns (old id, new id).
-- Run with push.internal_insert on (mark_internal_insert); the insert's NOTIFY wakes the workers.
WITH moved AS (
    DELETE FROM push.jobs AS d WHERE d.id = ANY (:ids::bigint[]) AND d.state = 'superseded' RETURNING d.*
), inserted AS (
    INSERT INTO push.jobs (
        topic, device_token, channel_id, payload, push_type, priority, environment, credential,
        collapse_id, expires_at, run_at, apns_id, max_attempts, created_at, history, deliver_once,
        coalesce_key, platform, traceparent, trace_first_span, recipient, parent_id, auto_environment,
        activity_id)
    SELECT topic, device_token, channel_id, payload, push_type, priority, environment, credential,
           collapse_id, expires_at, now(), apns_id, max_attempts, created_at,
           history || jsonb_build_array(jsonb_build_object(
               'outcome', 'revived', 'at', now(), 'previous_id', id,
               'superseded_by', superseded_by)),
           deliver_once, coalesce_key, platform, traceparent, trace_first_span, recipient, parent_id,
           auto_environment, activity_id
      FROM moved ORDER BY id
    RETURNING id, apns_id
)
SELECT m.id, i.id FROM inserted AS i JOIN moved AS m USING (apns_id)

-- name: fan_out
-- Fans out the recipients' jobs :ids (claimed by :worker_id as attempt :attempts) to their recipients' live
-- devices: one child job per token of kind `device` in push.devices for the job's topic and platform, due
-- now, with the parent's payload and options, the device's environment, the apns_id
-- push.child_apns_id(parent's, token) and, for a keyed parent, the key `<parent's key>@<token fingerprint>`
-- (latest wins per device). The parent ends `fanned_out` with its children's ids in `children`. A parent
-- with no live device moves to the dead letters (NoDevice, the sentence :no_device_sentence with the
-- recipient, topic and platform filled in); one whose key has a newer recipient's job ends superseded by it,
-- as the claim's latest-wins would. Fenced like an outcome (id, attempt, :worker_id, still running): a
-- parent cancelled or taken back meanwhile is left alone. Run with push.internal_insert on
-- (mark_internal_insert): the children's insert wakes the workers. Returns (parent id, state, children).
-- Claimed at once: up to :claim_limit children (0: none) are inserted `running`, leased to :worker_id for
-- :lease_seconds as attempt 1, as a claim would take them, when nothing the claim applies could hold them
-- back: the parent has no key (latest-wins is the claim's), no pause or rate limit matches its credential
-- and topic, and the worker avoids none of the child's environment, environment/credential pair or
-- credential/topic pair (:excluded_environments, :excluded_pairs, :excluded_topics, as for the claim). The
-- rest are inserted `pending`, for any worker's claim.
-- Each part reads the parents once, in one pass: a per-parent lookup into another part (a CTE has no index)
-- made the statement quadratic in the batch (60 ms for 250 recipients' jobs instead of 25).
WITH parents AS MATERIALIZED (
    -- Each parent with its live tokens (and their environments), and the newer job of its key if any.
    SELECT j.*, d.tokens, d.environments, n.by,
           :claim_limit::int > 0 AND j.coalesce_key IS NULL
           AND NOT EXISTS (SELECT 1 FROM push.pauses AS x
                            WHERE (x.credential IS NULL OR x.credential = j.credential)
                              AND (x.topic IS NULL OR x.topic = j.topic))
           AND NOT EXISTS (SELECT 1 FROM push.rate_limits AS x
                            WHERE (x.credential IS NULL OR x.credential = j.credential)
                              AND (x.topic IS NULL OR x.topic = j.topic)) AS claims
      FROM push.jobs AS j
      LEFT JOIN LATERAL (
        SELECT array_agg(x.token ORDER BY x.token) AS tokens,
               array_agg(CASE WHEN j.platform = 'fcm' THEN 'fcm' ELSE x.environment END ORDER BY x.token)
                   AS environments
          FROM push.devices AS x
         WHERE x.recipient = j.recipient AND x.topic = j.topic AND x.platform = j.platform
           AND x.kind = 'device' AND x.invalidated_at IS NULL) AS d ON true
      LEFT JOIN LATERAL (
        SELECT n.id AS by FROM push.jobs AS n
         WHERE j.coalesce_key IS NOT NULL AND n.coalesce_key = j.coalesce_key AND n.topic = j.topic
           AND n.environment = j.environment AND n.recipient IS NOT NULL AND n.id > j.id
           AND (n.state IN ('running', 'fanned_out') OR (n.state = 'pending' AND n.run_at <= now()))
         ORDER BY n.id DESC LIMIT 1) AS n ON true
     WHERE j.id = ANY (:ids::bigint[])
       AND j.attempts = (:attempts::smallint[])[array_position(:ids::bigint[], j.id)]
       AND j.locked_by = :worker_id AND j.state = 'running' AND j.recipient IS NOT NULL
     ORDER BY j.id
     FOR NO KEY UPDATE OF j
), children AS (
    INSERT INTO push.jobs (
        topic, device_token, payload, push_type, priority, environment, credential, collapse_id, expires_at,
        apns_id, max_attempts, deliver_once, coalesce_key, platform, traceparent, parent_id,
        state, attempts, locked_by, locked_until)
    SELECT p.topic, p.token, p.payload, p.push_type, p.priority, p.environment, p.credential, p.collapse_id,
           p.expires_at, push.child_apns_id(p.apns_id, p.token), p.max_attempts, p.deliver_once,
           -- At most 255 bytes: a key over 238 bytes (or characters of several bytes) goes by its md5.
           CASE WHEN p.coalesce_key IS NOT NULL
                THEN CASE WHEN octet_length(p.coalesce_key) <= 238 THEN p.coalesce_key ELSE md5(p.coalesce_key) END
                     || '@' || left(encode(sha256(convert_to(p.token, 'UTF8')), 'hex'), 16)
           END,
           p.platform, p.traceparent, p.id,
           CASE WHEN p.claimed THEN 'running' ELSE 'pending' END, CASE WHEN p.claimed THEN 1 ELSE 0 END,
           CASE WHEN p.claimed THEN :worker_id END,
           CASE WHEN p.claimed THEN now() + make_interval(secs => :lease_seconds) END
      FROM (SELECT c.*, c.claims AND sum(c.claims::int) OVER (ORDER BY c.id, c.token) <= :claim_limit AS claimed
              FROM (SELECT p.topic, p.payload, p.push_type, p.priority, p.credential, p.collapse_id, p.expires_at,
                           p.apns_id, p.max_attempts, p.deliver_once, p.coalesce_key, p.platform, p.traceparent,
                           p.id, t.token, t.environment,
                           -- Not what the claim would leave out for this worker now: an environment, an
                           -- environment/credential pair, a credential/topic pair APNs refused ('auto' goes
                           -- to production first).
                           p.claims
                           AND NOT (replace(t.environment, 'auto', 'production') = ANY (:excluded_environments::text[]))
                           AND NOT (replace(t.environment, 'auto', 'production') || '/' || p.credential
                                    = ANY (:excluded_pairs::text[]))
                           AND NOT (t.environment <> 'fcm'
                                    AND p.credential || '/' || p.topic = ANY (:excluded_topics::text[])) AS claims
                      FROM parents AS p
                     CROSS JOIN LATERAL unnest(p.tokens, p.environments) AS t (token, environment)
                     WHERE p.by IS NULL) AS c) AS p
     ORDER BY p.id, p.token
    -- A second child of a parent and token, or a live job that already holds the derived apns_id: skipped
    -- (and one whose apns_id the ledger holds, by the insert trigger: that push went out).
    ON CONFLICT DO NOTHING
    RETURNING id, parent_id
), kids AS MATERIALIZED (
    -- The children's ids by parent, as one map (a key lookup per parent, not a scan), built once.
    SELECT jsonb_object_agg(k.parent_id::text, k.ids) AS map
      FROM (SELECT parent_id, jsonb_agg(id ORDER BY id) AS ids FROM children GROUP BY parent_id) AS k
), ended AS (
    UPDATE push.jobs AS j
       SET state = CASE WHEN p.by IS NOT NULL THEN 'superseded' ELSE 'fanned_out' END,
           superseded_by = p.by,
           reason = CASE WHEN p.by IS NOT NULL THEN 'Superseded' END,
           children = CASE WHEN p.by IS NULL
                           THEN ARRAY(SELECT jsonb_array_elements_text(k.map -> j.id::text)::bigint) END,
           first_attempt_at = coalesce(j.first_attempt_at, now()), last_attempt_at = now(),
           locked_by = NULL, locked_until = NULL,
           history = push.append_history(j.history, CASE WHEN p.by IS NOT NULL
               THEN jsonb_build_object('outcome', 'superseded', 'at', now(), 'by', p.by)
               ELSE jsonb_build_object('outcome', 'fanned_out', 'at', now(), 'children', cardinality(p.tokens))
               END)
      FROM parents AS p CROSS JOIN kids AS k
     WHERE j.id = p.id AND (p.by IS NOT NULL OR p.tokens IS NOT NULL)
    RETURNING j.id, j.state, j.children, j.apns_id, j.platform, j.topic, j.trap_ids
), moved AS (
    DELETE FROM push.jobs AS j USING parents AS p
     WHERE j.id = p.id AND p.by IS NULL AND p.tokens IS NULL
    RETURNING j.*
), dead AS (
    INSERT INTO push.dead_jobs ({{dead_letter_columns}})
    SELECT id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
           collapse_id, expires_at, run_at, apns_id, max_attempts, attempts, transport_retries, NULL,
           'NoDevice', trap_ids, apns_unique_id, created_at, coalesce(first_attempt_at, now()), now(), NULL, now(),
           format(:no_device_sentence::text, recipient, topic, platform),
           push.append_history(history, jsonb_build_object('outcome', 'dead', 'at', now(), 'reason', 'NoDevice')),
           deliver_once, coalesce_key, platform, provider_message_id, traceparent, trace_first_span, recipient,
           parent_id, auto_environment, activity_id
      FROM moved
    {{dead_conflict}}
    RETURNING id
), deliveries AS (
    -- Webhooks that take `dead` or `superseded` hear of these in this statement.
    INSERT INTO push.webhook_deliveries (webhook_id, event, job_id, body)
    SELECT h.id, e.event, e.id, {{webhook_delivery_body}}
      FROM push.webhooks AS h
      JOIN (SELECT id, 'superseded' AS event, 'superseded' AS state, apns_id, platform, topic,
                   NULL::smallint AS status, 'Superseded' AS reason, trap_ids
              FROM ended WHERE state = 'superseded'
            UNION ALL
            SELECT id, 'dead', 'dead', apns_id, platform, topic, NULL, 'NoDevice', trap_ids FROM moved) AS e
        ON e.event = ANY (h.events) AND (h.topic IS NULL OR h.topic = e.topic)
     WHERE h.disabled_at IS NULL
    RETURNING 1
)
SELECT id, state, coalesce(children, '{}') FROM ended
UNION ALL
SELECT id, 'dead', '{}'::bigint[] FROM dead
