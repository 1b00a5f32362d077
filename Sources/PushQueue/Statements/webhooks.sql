-- push.webhooks and their outbox, push.webhook_deliveries: the operator's verbs (JobQueue+Webhooks.swift) and
-- the senders' claim, record and prune (JobQueue+WebhookOutbox.swift).
-- Each statement starts at its `-- name:` line; the comment lines right after it describe it.

-- name: add
-- A hook; the schema's constraints name what is wrong with a bad one.
INSERT INTO push.webhooks (url, events, topic, secret_file)
VALUES (:url, :events::text[], :topic, :secret_file)
RETURNING id, url, events, topic, secret_file, created_at, disabled_reason

-- name: disable_for_removal
-- The first of a removal's three steps: outcome writes stop matching the hook, claims stop taking its
-- deliveries.
UPDATE push.webhooks SET disabled_at = coalesce(disabled_at, now()),
       disabled_reason = coalesce(disabled_reason, 'being removed')
 WHERE id = :id RETURNING id

-- name: delete_deliveries
-- The second: its deliveries, :batch_size at a time.
DELETE FROM push.webhook_deliveries WHERE id IN (
    SELECT id FROM push.webhook_deliveries WHERE webhook_id = :id LIMIT :batch_size FOR UPDATE SKIP LOCKED)
RETURNING id

-- name: remove
-- The third: the hook's row.
DELETE FROM push.webhooks WHERE id = :id RETURNING id

-- name: list
-- Every hook, oldest first, with its deliveries waiting, failing and dead.
SELECT w.id, w.url, w.events, w.topic, w.secret_file, w.created_at, w.disabled_reason,
       count(*) FILTER (WHERE d.state IN ('pending', 'running')),
       count(*) FILTER (WHERE d.state IN ('pending', 'running') AND d.last_error IS NOT NULL),
       count(*) FILTER (WHERE d.state = 'dead')
  FROM push.webhooks AS w LEFT JOIN push.webhook_deliveries AS d ON d.webhook_id = w.id
 GROUP BY w.id ORDER BY w.id

-- name: enable
-- A hook a 410 (or an operator) disabled, enabled again by a replay of its deliveries.
UPDATE push.webhooks SET disabled_at = NULL, disabled_reason = NULL
 WHERE id = :id AND disabled_at IS NOT NULL RETURNING id

-- name: replay
-- Dead deliveries (by id, or every one of :hook) queued again: due now, 24 hours afresh, id and body kept.
UPDATE push.webhook_deliveries
   SET state = 'pending', run_at = now(), created_at = now(), last_error = NULL,
       last_status = NULL, locked_by = NULL, locked_until = NULL
 WHERE state = 'dead' AND (id = ANY (:ids::bigint[]) OR webhook_id = :hook::bigint)
RETURNING id

-- name: disabled_hooks_of
-- The hooks of these deliveries that are disabled (their deliveries wait until `replay --hook`).
SELECT DISTINCT w.id FROM push.webhook_deliveries AS d JOIN push.webhooks AS w ON w.id = d.webhook_id
 WHERE d.id = ANY (:ids::bigint[]) AND w.disabled_at IS NOT NULL ORDER BY w.id

-- name: failing
-- A hook's most recent failed deliveries (dead or still retrying), newest first.
SELECT id, event, job_id, state, attempts, last_status, last_error, run_at, created_at
  FROM push.webhook_deliveries
 WHERE webhook_id = :hook AND (state = 'dead' OR (state IN ('pending', 'running') AND last_error IS NOT NULL))
 ORDER BY id DESC LIMIT :limit

-- name: claim_deadline
-- The caller's deadline, on the server too, for the rest of the claim's transaction.
SELECT set_config('statement_timeout', :timeout, true)

-- name: claim_hooks
-- The claim's first statement: the enabled hooks with due deliveries, locked (FOR NO KEY UPDATE SKIP LOCKED:
-- outcome writes' foreign-key checks are not blocked; a hook another worker is claiming for is skipped).
SELECT w.id FROM push.webhooks AS w
 WHERE w.disabled_at IS NULL
   AND EXISTS (SELECT 1 FROM push.webhook_deliveries AS d
                WHERE d.webhook_id = w.id AND d.state IN ('pending', 'running') AND d.run_at <= now()
                  AND (d.state = 'pending' OR d.locked_until < now()))
 ORDER BY w.id
 FOR NO KEY UPDATE OF w SKIP LOCKED

-- name: claim_deliveries
-- The second, with a snapshot taken after those locks: each hook's room (:per_hook less its deliveries in
-- flight), its oldest due deliveries up to that, at most :limit in all, oldest due first across hooks.
WITH hooks AS MATERIALIZED (
    SELECT h.id,
           :per_hook - (SELECT count(*) FROM push.webhook_deliveries AS r
                         WHERE r.webhook_id = h.id AND r.state = 'running' AND r.locked_until >= now())
           AS room
      FROM unnest(:hooks::bigint[]) AS h (id)
), picked AS (
    SELECT p.id FROM hooks AS h CROSS JOIN LATERAL (
        SELECT d.id, d.run_at FROM push.webhook_deliveries AS d
         WHERE d.webhook_id = h.id AND d.state IN ('pending', 'running') AND d.run_at <= now()
           AND (d.state = 'pending' OR d.locked_until < now())
         ORDER BY d.run_at LIMIT greatest(h.room, 0)
         FOR NO KEY UPDATE SKIP LOCKED
    ) AS p
    ORDER BY p.run_at
    LIMIT :limit
)
UPDATE push.webhook_deliveries AS d
   SET state = 'running', attempts = d.attempts + 1, locked_by = :worker_id,
       locked_until = now() + make_interval(secs => :lease_seconds)
  FROM push.webhooks AS w
 WHERE d.id IN (SELECT id FROM picked) AND w.id = d.webhook_id
RETURNING d.id, d.webhook_id, w.url, w.secret_file, d.event, d.job_id, d.body::text, d.attempts,
          d.created_at,
          CASE WHEN isfinite(d.created_at)
               THEN least(extract(epoch FROM now() - d.created_at), 1e9) ELSE 1e9 END::float8

-- name: record_tries
-- Tries of deliveries this worker holds, fenced by holder and attempt; a retry past the window is dead; a
-- 410 disables its hook. Arrays of optionals do not bind: status 0 and error '' stand for none.
WITH input AS (
    SELECT u.id, u.attempt, u.kind, NULLIF(u.status, 0) AS status, NULLIF(u.error, '') AS error, u.wait
      FROM unnest(:ids::bigint[], :attempts::int[], :kinds::text[], :statuses::int[],
                  :errors::text[], :waits::float8[]) AS u (id, attempt, kind, status, error, wait)
), updated AS (
    UPDATE push.webhook_deliveries AS d
       SET state = CASE WHEN i.kind = 'delivered' THEN 'delivered'
                        WHEN i.kind = 'retry'
                             AND now() + make_interval(secs => i.wait)
                                 <= d.created_at + make_interval(secs => :window_seconds)
                        THEN 'pending'
                        ELSE 'dead' END,
           run_at = CASE WHEN i.kind = 'retry' THEN now() + make_interval(secs => i.wait) ELSE d.run_at END,
           delivered_at = CASE WHEN i.kind = 'delivered' THEN now() END,
           last_status = i.status,
           last_error = CASE WHEN i.kind = 'delivered' THEN NULL
                             WHEN i.kind = 'retry'
                                  AND now() + make_interval(secs => i.wait)
                                      > d.created_at + make_interval(secs => :window_seconds)
                             THEN 'gave up after 24 hours: ' || coalesce(i.error, 'no answer')
                             ELSE i.error END,
           locked_by = NULL, locked_until = NULL
      FROM input AS i
     WHERE d.id = i.id AND d.attempts = i.attempt AND d.state = 'running' AND d.locked_by = :worker_id
    RETURNING d.id, d.state, d.webhook_id, i.kind, i.status
), disabled AS (
    UPDATE push.webhooks AS w
       SET disabled_at = now(),
           disabled_reason = 'the receiver answered 410 Gone at '
                             || to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || 'Z'
     WHERE w.id IN (SELECT webhook_id FROM updated WHERE kind = 'gone') AND w.disabled_at IS NULL
    RETURNING w.id
)
SELECT CASE WHEN u.kind = 'gone' THEN 'gone' ELSE u.state END, NULL::bigint FROM updated AS u
UNION ALL
SELECT 'disabled', id FROM disabled

-- name: reclaim_previous_life
-- Deliveries an earlier process of this worker id left running (it died mid-POST), due again at once.
UPDATE push.webhook_deliveries SET state = 'pending', locked_by = NULL, locked_until = NULL, run_at = now()
 WHERE state = 'running' AND locked_by = :worker_id
RETURNING id

-- name: kill_disabled
-- The pending deliveries of a disabled hook (and lapsed running ones) dead, saying why, :batch_size at a time:
-- nobody claims them; `webhooks replay` enables the hook and sends them again. Their month starts now.
UPDATE push.webhook_deliveries AS d
   SET state = 'dead', locked_by = NULL, locked_until = NULL, created_at = now(),
       last_error = 'its hook is disabled (' || coalesce(w.disabled_reason, 'no reason given')
                    || '): webhooks replay enables it and sends this again'
  FROM push.webhooks AS w
 WHERE d.webhook_id = w.id AND w.disabled_at IS NOT NULL
   AND d.id IN (SELECT r.id FROM push.webhook_deliveries AS r JOIN push.webhooks AS h ON h.id = r.webhook_id
                 WHERE h.disabled_at IS NOT NULL
                   AND (r.state = 'pending' OR (r.state = 'running' AND r.locked_until < now()))
                 LIMIT :batch_size FOR UPDATE OF r SKIP LOCKED)
RETURNING d.id

-- name: prune_delivered
-- Delivered deliveries past the retention, through their partial index (schema 14): only the rows it deletes.
DELETE FROM push.webhook_deliveries WHERE id IN (
    SELECT id FROM push.webhook_deliveries
     WHERE state = 'delivered' AND delivered_at < now() - make_interval(secs => :retention_seconds)
     LIMIT :batch_size FOR UPDATE SKIP LOCKED)
RETURNING id

-- name: prune_dead
-- Dead deliveries past 31 days, through their partial index.
DELETE FROM push.webhook_deliveries WHERE id IN (
    SELECT id FROM push.webhook_deliveries
     WHERE state = 'dead' AND created_at < now() - interval '31 days'
     LIMIT :batch_size FOR UPDATE SKIP LOCKED)
RETURNING id
