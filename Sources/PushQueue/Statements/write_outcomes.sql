-- The outcome write (JobQueue.writeOutcomes, JobQueue+Outcomes.swift): one statement for a batch: update
-- delivered/retried/requeued jobs, move dead ones with their history, upsert invalid tokens. Every write is
-- fenced on (id, attempt, :worker_id). `locked_by` is set by a claim and cleared by every outcome; the reaper
-- leaves it, so the late outcome of a job that was taken back but not yet re-claimed is still accepted (and
-- the job not sent twice). A re-claim bumps `attempts` and sets `locked_by`, which fences the old holder out.
-- The state must still be `running` or `pending` (returned by the reaper): a job superseded or delivered
-- meanwhile is never brought back by a late outcome (superseding clears `locked_by` too). Every time is
-- Postgres's now() (less the outcome's age, plus its delay).
WITH updated AS (
    UPDATE push.jobs AS j
       -- A job cancelled while its request was in flight: the request completes (a 200 is recorded as
       -- delivered), but it is never retried.
       SET state = CASE WHEN i.kind = 'delivered' THEN 'delivered'
                        WHEN j.state = 'cancelled' THEN 'cancelled' ELSE 'pending' END,
           run_at = CASE WHEN i.kind = 'delivered' THEN j.run_at ELSE now() + i.delay_ms * interval '1 millisecond' END,
           attempts = CASE WHEN i.kind IN ('requeue', 'transport_retry', 'switch_environment') THEN j.attempts - 1
                           ELSE j.attempts END,
           -- An 'auto' job production answered BadDeviceToken: once more, to development, uncounted.
           environment = CASE WHEN i.kind = 'switch_environment' THEN 'development' ELSE j.environment END,
           transport_retries = j.transport_retries + CASE WHEN i.kind = 'transport_retry' THEN 1 ELSE 0 END,
           status = i.st,
           reason = CASE WHEN i.kind = 'delivered' THEN j.reason ELSE i.rs END,
           trap_ids = CASE WHEN cardinality(i.trap_arr) = 0 THEN j.trap_ids
                           ELSE push.merge_trap_ids(j.trap_ids, i.trap_arr) END,
           -- unique_id: the provider's id of the answer (APNs' apns-unique-id or apns-request-id; FCM's
           -- message name).
           apns_unique_id = CASE WHEN j.platform = 'fcm' THEN j.apns_unique_id
                                 ELSE coalesce(NULLIF(i.unique_id, ''), j.apns_unique_id) END,
           provider_message_id = CASE WHEN j.platform = 'fcm' THEN coalesce(NULLIF(i.unique_id, ''), j.provider_message_id)
                                      ELSE j.provider_message_id END,
           first_attempt_at = coalesce(j.first_attempt_at, CASE WHEN i.sent THEN i.at END),
           last_attempt_at = CASE WHEN i.sent THEN i.at ELSE j.last_attempt_at END,
           delivered_at = CASE WHEN i.kind = 'delivered' THEN now() ELSE NULL END,
           latency_ms = i.lat,
           -- A traced job's first attempt: the span its retries link to.
           trace_first_span = coalesce(j.trace_first_span, NULLIF(i.span, '')),
           locked_by = NULL,
           locked_until = NULL,
           -- The attempt that delivered lives in the row's columns (status, latency_ms, delivered_at,
           -- last_attempt_at, apns_unique_id); history keeps the attempts that did not deliver.
           history = CASE WHEN i.kind = 'delivered' THEN j.history
                          ELSE push.append_history(j.history, i.entry) END
      FROM {{outcome_input_rows}} AS i
     WHERE j.id = i.id AND j.attempts = i.attempt AND j.locked_by = :worker_id
       AND (j.state IN ('running', 'pending') OR (j.state = 'cancelled' AND i.sent)) AND i.kind <> 'dead'
    RETURNING j.id, j.state, j.platform, j.topic, j.apns_id, j.status, j.reason, j.trap_ids,
              -- An 'auto' job delivered: the device learns the environment that answered.
              CASE WHEN j.auto_environment AND i.kind = 'delivered'
                   THEN push.device_environment_answered(j.topic, j.device_token, j.environment, NULL, i.at)
              END AS learned
), moved AS (
    DELETE FROM push.jobs AS j
     USING {{outcome_input_rows}} AS i
     WHERE j.id = i.id AND j.attempts = i.attempt AND j.locked_by = :worker_id
       AND (j.state IN ('running', 'pending') OR (j.state = 'cancelled' AND i.sent)) AND i.kind = 'dead'
    RETURNING j.*, i.st, i.rs, i.trap_arr, i.unique_id, i.lat, i.at, i.sent, i.error, i.entry,
              i.invalidate, i.ts_ms, i.span,
              -- An 'auto' job development refused too, after production: the device is invalidated.
              CASE WHEN j.auto_environment AND j.environment = 'development' AND i.rs = 'BadDeviceToken'
                   THEN push.device_environment_answered(j.topic, j.device_token, j.environment, i.rs, i.at)
              END AS learned
), dead AS (
    INSERT INTO push.dead_jobs ({{dead_letter_columns}})
    SELECT id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
           collapse_id, expires_at, run_at, apns_id, max_attempts, attempts, transport_retries, st,
           coalesce(rs, 'Unknown'), push.merge_trap_ids(trap_ids, trap_arr),
           CASE WHEN platform = 'fcm' THEN apns_unique_id ELSE coalesce(NULLIF(unique_id, ''), apns_unique_id) END,
           created_at,
           coalesce(first_attempt_at, CASE WHEN sent THEN at END), CASE WHEN sent THEN at ELSE last_attempt_at END,
           lat, now(), error, push.append_history(history, entry), deliver_once, coalesce_key, platform,
           provider_message_id, traceparent, coalesce(trace_first_span, NULLIF(span, '')), recipient, parent_id,
           auto_environment, activity_id
      FROM moved
    {{dead_conflict}}
    RETURNING id
), tokens AS (
    INSERT INTO push.invalid_tokens AS t
           (platform, device_token, topic, environment, reason, invalidated_at, apns_timestamp_ms, job_id)
    SELECT DISTINCT ON (device_token, topic, environment)
           platform, device_token, topic, environment, coalesce(rs, 'Unknown'),
           CASE WHEN ts_sane THEN to_timestamp(ts_ms::double precision / 1000) ELSE now() END,
           CASE WHEN ts_sane THEN ts_ms END, id
      FROM (SELECT m.*, (m.ts_ms BETWEEN 1262304000000 AND (extract(epoch FROM now()) * 1000 + 86400000)::bigint) AS ts_sane
              FROM moved AS m) AS moved
     -- A 410 timestamp is range-checked (2010 to tomorrow); a token too long for the index is
     -- no real token: its dead letter says so, and no invalid-token row is written.
     WHERE invalidate AND device_token IS NOT NULL AND octet_length(device_token) <= 2048
     -- The key stays (device_token, topic, environment), as schema 9's workers name it: an fcm token's
     -- environment is 'fcm', so the platforms never meet in it.
     ORDER BY device_token, topic, environment, ts_ms DESC
    ON CONFLICT (device_token, topic, environment) DO UPDATE
       SET reason = excluded.reason, invalidated_at = excluded.invalidated_at,
           apns_timestamp_ms = excluded.apns_timestamp_ms, job_id = excluded.job_id
     WHERE excluded.invalidated_at >= t.invalidated_at
    RETURNING 1
), hooks AS MATERIALIZED (
    -- Webhooks (schema 11): every outcome a hook takes becomes a delivery in this same statement, so a crash
    -- loses neither. With no hook, the join below reads nothing of the outcomes.
    SELECT id, events, topic FROM push.webhooks WHERE disabled_at IS NULL
), deliveries AS (
    INSERT INTO push.webhook_deliveries (webhook_id, event, job_id, body)
    SELECT h.id, e.event, e.id, {{webhook_delivery_body}}
      FROM hooks AS h
      JOIN (SELECT u.id, 'delivered' AS event, u.apns_id, u.platform, u.topic, 'delivered' AS state, u.status,
                   u.reason, u.trap_ids
              FROM updated AS u WHERE u.state = 'delivered'
            UNION ALL
            SELECT m.id, 'dead', m.apns_id, m.platform, m.topic, 'dead', m.st, coalesce(m.rs, 'Unknown'),
                   push.merge_trap_ids(m.trap_ids, m.trap_arr)
              FROM moved AS m
            UNION ALL
            SELECT m.id, 'token_invalid', m.apns_id, m.platform, m.topic, 'dead', m.st, coalesce(m.rs, 'Unknown'),
                   push.merge_trap_ids(m.trap_ids, m.trap_arr)
              FROM moved AS m WHERE m.invalidate) AS e
        ON e.event = ANY (h.events) AND (h.topic IS NULL OR h.topic = e.topic)
    RETURNING 1
)
SELECT id FROM updated UNION ALL SELECT id FROM dead
