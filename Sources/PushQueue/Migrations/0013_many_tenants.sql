-- Schema 13: a claim bounded by its batch (many tenants).
--
-- The claim walks each (credential, environment)'s topics from the claimer's cursor, a batch's worth per
-- claim, and every latest-wins probe is driven from the small side (a candidate, a claimed key). Those
-- probes ask for a key's pending jobs in one (topic, environment): this index answers them with all its
-- columns bound.
--
-- Its predicate says "pending" as a range (state >= 'pending' AND state <= 'pending', the same rows as
-- state = 'pending'), and the claim's probes say it the same way. The planner proves a partial index usable
-- only from a query's own conditions: written so, the probes can use this index and no other partial index
-- of pending jobs. With statistics taken when no job was pending (after a drain, autovacuum's own ANALYZE),
-- every pending index looks equally empty, and the planner chose jobs_claim_by_topic_idx for these probes,
-- reading all of a topic's pending jobs per claimed job (and, in schema 12's statement, every pending row
-- once per pending row: 40 s for one claim). jobs_coalesce_idx stays for the verbs that find jobs by key.
--
-- Built without blocking producers; `push-worker migrate` runs what follows outside a transaction, one
-- statement at a time (psql: without -1). Workers of schema 12 still claim correctly beside it.
-- push:outside-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_coalesce_scope_idx
    ON push.jobs (coalesce_key, topic, environment, id)
    WHERE state >= 'pending' AND state <= 'pending' AND coalesce_key IS NOT NULL;

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (13, '0013_many_tenants.sql') ON CONFLICT (version) DO NOTHING;
