-- push.workers: heartbeats, leases of gone workers, credentials no worker holds (JobQueue+Workers.swift).
-- Each statement starts at its `-- name:` line; the comment lines right after it describe it.

-- name: heartbeat
-- Registers or refreshes a worker's row, unless another live instance heartbeats under its id (no row back).
INSERT INTO push.workers AS w (worker_id, host, pid, credentials, session_tracked, instance)
VALUES (:worker_id, :host, :pid, :credentials::text[], :session_tracked, :instance::uuid)
ON CONFLICT (worker_id) DO UPDATE
   SET heartbeat_at = now(), host = excluded.host, pid = excluded.pid, credentials = excluded.credentials,
       stopped_at = NULL, session_tracked = excluded.session_tracked, instance = excluded.instance
 WHERE excluded.instance IS NULL OR w.instance IS NULL OR w.instance = excluded.instance
    OR w.stopped_at IS NOT NULL OR w.heartbeat_at < now() - make_interval(secs => :stale_seconds)
RETURNING 1

-- name: holder
-- Who holds a worker id, for the error that says so.
SELECT host, pid, extract(epoch FROM now() - heartbeat_at)::float8 FROM push.workers WHERE worker_id = :worker_id

-- name: deregister
-- A clean stop: the row stays as "last seen with these credentials"; with an instance, only its own row.
UPDATE push.workers SET stopped_at = now(), heartbeat_at = now()
 WHERE worker_id = :worker_id AND (:instance::uuid IS NULL OR instance IS NULL OR instance = :instance::uuid)

-- name: return_running
-- The running jobs a worker holds in the table but not in memory (a previous life, a claim answer lost in a
-- failover) back to pending.
UPDATE push.jobs AS j
   SET {{back_to_pending}}
 WHERE j.state = 'running' AND j.locked_by = :worker_id AND NOT (j.id = ANY (:held::bigint[]))
RETURNING j.id

-- name: reap_gone_workers
-- The running jobs of workers that are gone back to pending (JobQueue.reapJobsOfGoneWorkers says when a
-- worker is gone); rows another statement holds are skipped.
WITH holders AS MATERIALIZED (
    SELECT w.worker_id,
           w.heartbeat_at > now() - make_interval(secs => :stale_seconds)
           -- Last seen before Postgres restarted, and the restart is recent: cut off, not gone.
           OR (w.heartbeat_at < pg_postmaster_start_time()
               AND pg_postmaster_start_time() > now() - make_interval(secs => :grace_seconds))
           -- Frozen or cut off: its sessions are still open. Not gone until the longer bound.
           OR (w.session_tracked AND w.heartbeat_at > now() - make_interval(secs => :frozen_seconds)
               AND EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity AS a
                            WHERE a.application_name = left(w.worker_id, 63)
                              AND a.datname = current_database())) AS live
      FROM push.workers AS w
), reaped AS MATERIALIZED (
    SELECT r.id FROM push.jobs AS r LEFT JOIN holders AS h ON h.worker_id = r.locked_by
     WHERE r.state = 'running'
       AND ((r.locked_by = :worker_id AND r.locked_until < now())
            OR (r.locked_by <> :worker_id AND h.live IS FALSE)
            OR (r.locked_by <> :worker_id AND h.live IS NULL AND r.locked_until < now()))
     FOR NO KEY UPDATE OF r SKIP LOCKED
)
UPDATE push.jobs AS j
   SET {{back_to_pending}}
 WHERE j.id IN (SELECT id FROM reaped) AND j.state = 'running'
RETURNING j.id

-- name: forget_silent_workers
-- Worker rows silent for a week.
DELETE FROM push.workers WHERE heartbeat_at < now() - interval '7 days'

-- name: dead_letter_unsignable
-- Pending jobs whose credential no worker was seen holding for the wait, dead-lettered with MS028 (1,000 at a
-- time), and the webhooks that take `dead` told in the same statement.
WITH seen AS (
    SELECT credentials FROM push.workers WHERE heartbeat_at > now() - make_interval(secs => :wait_seconds)
), moved AS (
    DELETE FROM push.jobs AS j
     WHERE j.id IN (SELECT p.id FROM push.jobs AS p
                     WHERE p.state = 'pending' AND p.run_at < now() - make_interval(secs => :wait_seconds)
                       AND NOT EXISTS (SELECT 1 FROM seen AS w
                                        WHERE cardinality(w.credentials) = 0
                                           -- An FCM credential registers as fcm:<name>.
                                           OR (CASE WHEN p.environment = 'fcm' THEN 'fcm:' || p.credential
                                                    ELSE p.credential END) = ANY (w.credentials))
                     LIMIT 1000 FOR UPDATE SKIP LOCKED)
    RETURNING j.*
), deliveries AS (
    -- Webhooks that take `dead` hear of these too, in this statement.
    INSERT INTO push.webhook_deliveries (webhook_id, event, job_id, body)
    SELECT h.id, 'dead', e.id, {{webhook_delivery_body}}
      FROM push.webhooks AS h
      JOIN (SELECT m.id, m.apns_id, m.platform, m.topic, 'dead' AS state, m.status,
                   'CredentialsMissing' AS reason, push.merge_trap_ids(m.trap_ids, '{MS028}') AS trap_ids,
                   'dead' AS event
              FROM moved AS m) AS e
        ON h.topic IS NULL OR h.topic = e.topic
     WHERE h.disabled_at IS NULL AND 'dead' = ANY (h.events)
    RETURNING 1
)
INSERT INTO push.dead_jobs ({{dead_letter_columns}})
SELECT id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
       collapse_id, expires_at, run_at, apns_id, max_attempts, attempts, transport_retries, status,
       'CredentialsMissing', push.merge_trap_ids(trap_ids, '{MS028}'), apns_unique_id, created_at,
       first_attempt_at, last_attempt_at, latency_ms, now(),
       CASE WHEN environment = 'fcm'
            THEN 'no running worker has an FCM service account for credential ''' || credential || ''' (MS028): give a worker FCM_SERVICE_ACCOUNT_PATH or a {"type": "fcm"} credential in its --config, then replay this job.'
            ELSE 'no running worker has a signing key for credential ''' || credential || ''' (MS028): name it in a worker''s --config or APNS_* settings, then replay this job.' END,
       push.append_history(history, jsonb_build_object('outcome', 'dead', 'at', now(), 'reason', 'CredentialsMissing')),
       deliver_once, coalesce_key, platform, provider_message_id, traceparent, trace_first_span, recipient, parent_id,
       auto_environment, activity_id
  FROM moved
{{dead_conflict}}
RETURNING id

-- name: durability
-- What the server promises for committed rows on failover.
SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
       (SELECT count(*) FROM pg_stat_replication)

-- name: list
-- The fleet's workers for the console: live ones first, then the stopped, each once.
SELECT worker_id, host, pid, credentials, started_at, heartbeat_at, stopped_at FROM push.workers
 ORDER BY stopped_at IS NOT NULL, heartbeat_at DESC LIMIT :limit
