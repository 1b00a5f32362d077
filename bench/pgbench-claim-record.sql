-- pgbench script: the claim and record SQL of JobQueue.claimBatch and JobQueue.record (delivered), one
-- worker per pgbench client (locked_by names the client). Run with -D batch=N; jobs/s = tps × N.
-- The claim is the one range a queue of one credential, one environment, one topic and one priority has:
-- the same index range scan of jobs_claim_by_topic_idx, lock and update as the worker's claim, without the
-- statement's other ranges and controls (they cost nothing on this data).
-- The record statement selects the batch by (locked_by, state) instead of unnest()ing the ids the claim
-- returned (pgbench cannot carry a result set between statements); it writes the same columns, and, like
-- the worker, keeps a delivered attempt in the row's columns, not in history.
WITH picked AS MATERIALIZED (
    SELECT id FROM push.jobs
     WHERE state = 'pending' AND credential = 'default' AND environment = 'production'
       AND topic = 'com.example.app' AND send_priority = 10 AND run_at <= now()
     ORDER BY run_at, id
     LIMIT :batch
     FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE push.jobs AS j
       SET state = 'running', attempts = j.attempts + 1, locked_by = 'pgbench-' || :client_id,
           locked_until = now() + make_interval(secs => 60.0)
     WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING j.*
)
SELECT j.id, j.apns_id, j.topic, j.device_token, j.channel_id, j.payload::text, j.push_type, j.priority,
       j.environment, j.credential, j.collapse_id, j.expires_at, j.run_at, j.max_attempts, j.attempts,
       j.trap_ids, j.created_at, j.first_attempt_at
  FROM claimed AS j
 ORDER BY j.send_priority DESC, j.run_at, j.id;

UPDATE push.jobs AS j
   SET state = 'delivered', status = 200, reason = j.reason, trap_ids = j.trap_ids,
       apns_unique_id = j.apns_unique_id, first_attempt_at = coalesce(j.first_attempt_at, now()),
       last_attempt_at = now(), delivered_at = now(), latency_ms = 1, locked_by = NULL, locked_until = NULL
 WHERE j.locked_by = 'pgbench-' || :client_id AND j.state = 'running';
