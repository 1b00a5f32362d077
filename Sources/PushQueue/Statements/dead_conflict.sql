-- A dead letter whose id is already taken merges into it: the newer row wins, both histories are kept.
ON CONFLICT (id) DO UPDATE SET
    topic = excluded.topic, device_token = excluded.device_token, channel_id = excluded.channel_id,
    payload = excluded.payload, push_type = excluded.push_type, priority = excluded.priority,
    environment = excluded.environment, credential = excluded.credential, collapse_id = excluded.collapse_id,
    deliver_once = excluded.deliver_once, coalesce_key = excluded.coalesce_key,
    platform = excluded.platform, provider_message_id = excluded.provider_message_id,
    traceparent = excluded.traceparent, trace_first_span = excluded.trace_first_span,
    recipient = excluded.recipient, parent_id = excluded.parent_id, auto_environment = excluded.auto_environment,
    activity_id = excluded.activity_id,
    expires_at = excluded.expires_at, run_at = excluded.run_at, apns_id = excluded.apns_id,
    max_attempts = excluded.max_attempts, attempts = excluded.attempts,
    transport_retries = excluded.transport_retries, status = excluded.status, reason = excluded.reason,
    trap_ids = push.merge_trap_ids(dead_jobs.trap_ids, excluded.trap_ids),
    apns_unique_id = excluded.apns_unique_id, created_at = excluded.created_at,
    first_attempt_at = excluded.first_attempt_at, last_attempt_at = excluded.last_attempt_at,
    latency_ms = excluded.latency_ms, dead_at = excluded.dead_at,
    error = excluded.error || ' (An older dead letter with the same id, apns_id ' || dead_jobs.apns_id
            || ', was merged into this one; its history comes first.)',
    history = dead_jobs.history || jsonb_build_array(jsonb_build_object('outcome', 'merged_dead_letter',
            'previous_apns_id', dead_jobs.apns_id, 'previous_reason', dead_jobs.reason)) || excluded.history
