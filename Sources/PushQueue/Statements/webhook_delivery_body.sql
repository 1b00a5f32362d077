-- A webhook delivery's body (schema 11), one shape for every event and every statement that writes one: `e`
-- is the outcome's row, with id, apns_id, platform, topic, state, status, reason, trap_ids and event.
jsonb_build_object('job_id', e.id, 'apns_id', e.apns_id, 'platform', e.platform, 'topic', e.topic,
                   'state', e.state, 'status', e.status, 'reason', e.reason,
                   'trap_ids', to_jsonb(e.trap_ids), 'at', now(), 'event', e.event)
