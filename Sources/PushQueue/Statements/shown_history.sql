-- A job's history as `jobs show` prints it: a delivered attempt is kept in the row's columns only (not in
-- history), so it is added as the last entry.
(CASE WHEN j.state = 'delivered'
      THEN j.history || jsonb_build_array(jsonb_build_object(
           'attempt', j.attempts, 'at', j.last_attempt_at, 'outcome', 'delivered',
           'status', j.status, 'reason', NULL, 'trap_ids', '[]'::jsonb,
           'latency_ms', j.latency_ms, 'sent', true))
      ELSE j.history END)
