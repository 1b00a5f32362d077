-- The outcome input, one row per outcome, as a subquery: each statement part unnests it itself so the
-- planner joins it to push.jobs by primary key (a shared CTE would be scanned once per job row).
(SELECT i.*,
        NULLIF(i.status, 0) AS st,
        NULLIF(i.reason, '') AS rs,
        coalesce(string_to_array(NULLIF(i.traps, ''), ','), '{}') AS trap_arr,
        NULLIF(i.latency, -1) AS lat,
        now() - i.age_ms * interval '1 millisecond' AS at,
        jsonb_build_object(
            'attempt', i.attempt, 'at', now() - i.age_ms * interval '1 millisecond', 'outcome', i.kind,
            'status', NULLIF(i.status, 0), 'reason', NULLIF(i.reason, ''),
            'trap_ids', to_jsonb(coalesce(string_to_array(NULLIF(i.traps, ''), ','), '{}')),
            'latency_ms', NULLIF(i.latency, -1), 'sent', i.sent, 'worker', :worker_id::text
        ) AS entry
   FROM unnest(:ids::bigint[], :attempts::smallint[], :kinds::text[], :delays_ms::bigint[], :statuses::smallint[], :reasons::text[],
               :traps::text[], :unique_ids::text[], :latencies_ms::integer[], :ages_ms::bigint[], :errors::text[], :sent::boolean[],
               :invalidate::boolean[], :timestamps_ms::bigint[], :spans::text[])
        AS i(id, attempt, kind, delay_ms, status, reason, traps, unique_id, latency, age_ms,
             error, sent, invalidate, ts_ms, span))
