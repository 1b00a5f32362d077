-- The operator's filter over dead letters `j` (DeadLetterFilter): each condition is skipped when its bind is
-- NULL (:no_trap false). Statements run unnamed, so Postgres plans them with the binds' values and folds the
-- skipped conditions away: each filter given is served by its own index, as if the condition were written
-- alone.
(:ids::bigint[] IS NULL OR j.id = ANY (:ids::bigint[]))
AND (:trap_id::text IS NULL OR j.trap_ids @> ARRAY[:trap_id::text])
AND (NOT :no_trap::boolean OR cardinality(j.trap_ids) = 0)
AND (:last_trap::text IS NULL OR j.trap_ids[array_upper(j.trap_ids, 1)] = :last_trap::text)
AND (:reason::text IS NULL OR j.reason = :reason::text)
AND (:topic::text IS NULL OR j.topic = :topic::text)
AND (:since::timestamptz IS NULL OR j.dead_at >= :since::timestamptz)
AND (:before::timestamptz IS NULL OR j.dead_at < :before::timestamptz)
