-- Over the candidates: conflicted also when two dead letters share an apns_id (from before apns_ids were kept
-- unique: the first moves, the others are reported as conflicts); and dead letters of one key replayed
-- together keep their order: once one is renumbered, every later one of its key is too (else the renumbered
-- older one would go out above a newer one left at its id).
conflicted OR (NOT :new_apns_id AND row_number() OVER (PARTITION BY apns_id ORDER BY id) > 1) AS conflicted,
(coalesce_key IS NOT NULL AND bool_or(renumber) OVER (PARTITION BY topic, environment, coalesce_key ORDER BY id))
    AS renumber
