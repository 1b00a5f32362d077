-- pgbench script: the same claim and record SQL as JobQueue.claim and JobQueue.record (delivered), one
-- worker. Run by `push-bench queue` with -D batch=N; jobs/s = tps × N.
-- The record statement here selects the batch by (locked_by, state) instead of unnest()ing the ids the
-- claim returned (pgbench cannot carry a result set between statements); it writes the same columns.
WITH picked AS MATERIALIZED (
    SELECT id FROM push.jobs
     WHERE state = 'pending' AND run_at <= now()
       AND NOT (credential = ANY ('{}'::text[]))
     ORDER BY send_priority DESC, run_at, id
     LIMIT :batch
     FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE push.jobs AS j
       SET state = 'running', attempts = j.attempts + 1, locked_by = 'pgbench',
           locked_until = now() + make_interval(secs => 60.0),
           first_attempt_at = coalesce(j.first_attempt_at, now())
     WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING j.*
)
SELECT j.id, j.apns_id, j.topic, j.device_token, j.channel_id, j.payload::text, j.push_type, j.priority,
       j.environment, j.credential, j.collapse_id, j.expires_at, j.run_at, j.max_attempts, j.attempts,
       j.trap_ids, j.created_at, j.first_attempt_at
  FROM claimed AS j
 ORDER BY j.send_priority DESC, j.run_at, j.id;

UPDATE push.jobs AS j
   SET state = 'delivered', status = 200, reason = j.reason,
       trap_ids = push.merge_trap_ids(j.trap_ids, '{}'::text[]),
       apns_unique_id = j.apns_unique_id, last_attempt_at = now(), delivered_at = now(), latency_ms = 1,
       locked_by = NULL, locked_until = NULL,
       history = j.history || jsonb_build_array(jsonb_build_object(
           'attempt', j.attempts, 'at', now(), 'outcome', 'delivered', 'status', 200, 'reason', NULL,
           'trap_ids', '[]'::jsonb, 'latency_ms', 1, 'sent', true, 'worker', 'pgbench'))
 WHERE j.locked_by = 'pgbench' AND j.state = 'running';
