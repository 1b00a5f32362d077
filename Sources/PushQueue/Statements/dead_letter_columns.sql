-- The columns every move into push.dead_jobs writes, in this order.
id, topic, device_token, channel_id, payload, push_type, priority, environment, credential, collapse_id,
expires_at, run_at, apns_id, max_attempts, attempts, transport_retries, status, reason, trap_ids,
apns_unique_id, created_at, first_attempt_at, last_attempt_at, latency_ms, dead_at, error, history,
deliver_once, coalesce_key, platform, provider_message_id, traceparent,
trace_first_span, recipient, parent_id, auto_environment, activity_id
