-- Schema 13: a claim bounded by its batch (many tenants).
--
-- The claim walks each (credential, environment)'s topics from the claimer's cursor, a batch's worth per
-- claim, and every latest-wins probe is driven from the small side (a candidate, a claimed key). Those
-- probes ask for a key's pending jobs in one (topic, environment): this index answers with all its columns
-- bound. The index it replaces led with the key alone; with statistics taken when no job was pending (after
-- a drain, autovacuum's own ANALYZE) the planner judged every pending index equally empty and read the whole
-- of another one per claimed row: 20,000 pending rows made one claim run 40 s.
--
-- Built without blocking producers; `push-worker migrate` runs what follows outside a transaction, one
-- statement at a time (psql: without -1). Workers of schema 12 still claim correctly with either index.
-- push:outside-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_coalesce_scope_idx
    ON push.jobs (coalesce_key, topic, environment, id) WHERE state = 'pending' AND coalesce_key IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS push.jobs_coalesce_idx;

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (13, '0013_many_tenants.sql') ON CONFLICT (version) DO NOTHING;
