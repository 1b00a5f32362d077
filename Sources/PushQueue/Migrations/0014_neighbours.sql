-- Schema 14: neighbours. The minute's prunes read only what they delete, and one worker id is one process.
--
-- Every worker prunes delivered webhook deliveries past retention, dead ones past 31 days, and latest-wins
-- marks past the apns-id memory, once a minute. No index served them: each pass read the whole table (401,000
-- outbox rows: 58-121 ms a pass on every worker; at 10 million deliveries a day kept a week, 70 million rows).
-- These indexes hold only the rows a prune looks for, ordered by the time it compares.
--
-- The outbox is written like push.jobs (inserted, claimed, updated, deleted): the same fillfactor and
-- autovacuum settings keep its updates HOT and its dead rows few.
--
-- Each worker process heartbeats with an instance id of its own: a second live process under the same worker
-- id (containers sharing a hostname, each PID 1) is refused instead of taking the first one's jobs back.
ALTER TABLE push.workers ADD COLUMN IF NOT EXISTS instance uuid;

ALTER TABLE push.webhook_deliveries SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

-- The indexes are built without blocking the workers' writes; `push-worker migrate` runs what follows outside
-- a transaction, one statement at a time (psql: without -1).
-- push:outside-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_deliveries_delivered_idx
    ON push.webhook_deliveries (delivered_at) WHERE state = 'delivered';
CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_deliveries_dead_idx
    ON push.webhook_deliveries (created_at) WHERE state = 'dead';
CREATE INDEX CONCURRENTLY IF NOT EXISTS coalesce_marks_updated_idx
    ON push.coalesce_marks (updated_at);

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (14, '0014_neighbours.sql') ON CONFLICT (version) DO NOTHING;
