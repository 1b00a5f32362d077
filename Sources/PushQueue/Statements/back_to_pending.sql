-- The SET clause that returns a running job to `pending`, due at once, same `apns_id`: the attempt stays
-- counted (its outcome is unknown), `locked_by` is kept so the old holder's late outcome is still accepted
-- until another worker re-claims the job, and the history says why (:why).
state = 'pending', run_at = now(), locked_until = NULL,
history = push.append_history(j.history, jsonb_build_object(
    'attempt', j.attempts, 'at', now(), 'outcome', 'lease_expired', 'worker', j.locked_by, 'why', :why::text))
