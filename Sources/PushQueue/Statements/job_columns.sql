-- The columns JobQueue.decodeJob reads, by position: the order here is the order there.
j.id, j.apns_id, j.topic, j.device_token, j.channel_id, j.payload::text AS payload, j.push_type, j.priority,
j.environment, j.credential, j.collapse_id, j.deliver_once, j.expires_at, j.run_at, j.max_attempts, j.attempts,
j.trap_ids, j.created_at, j.first_attempt_at, j.transport_retries, clock_timestamp() AS db_now, j.coalesce_key,
j.platform, j.traceparent, j.trace_first_span, j.last_attempt_at,
j.history->-1->>'outcome' AS last_outcome, j.recipient,
j.auto_environment, j.activity_id
