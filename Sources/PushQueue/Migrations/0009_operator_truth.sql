-- PushWorker schema, version 9: what an operator sees and does.
--
-- * state 'cancelled': an operator cancelled the job (`push-worker jobs cancel`); it is never sent. A job
--   cancelled while a worker held it keeps its holder: the worker withdraws it if its request was not yet
--   written, and an outcome of a request already in flight is still recorded (it completes).
-- * Indexes for the console's and `dead list`'s filters at millions of dead letters: by topic, and by the
--   reason a dead letter died with, each newest first.

ALTER TABLE push.jobs DROP CONSTRAINT IF EXISTS state_must_be_pending_running_delivered_superseded_or_cancelled;
ALTER TABLE push.jobs ADD CONSTRAINT state_must_be_pending_running_delivered_superseded_or_cancelled
    CHECK (state IN ('pending', 'running', 'delivered', 'superseded', 'cancelled')) NOT VALID;
ALTER TABLE push.jobs DROP CONSTRAINT IF EXISTS state_must_be_pending_running_delivered_or_superseded;

-- The constraint above was added NOT VALID (a brief lock, no scan); it is validated in a transaction of its
-- own, which lets producers insert meanwhile. The indexes are built without blocking writes.
-- push:outside-transaction
ALTER TABLE push.jobs VALIDATE CONSTRAINT state_must_be_pending_running_delivered_superseded_or_cancelled;
-- Retention of cancelled jobs (terminal, like superseded ones).
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_cancelled_idx ON push.jobs (created_at) WHERE state = 'cancelled';
CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_jobs_topic_dead_at_idx ON push.dead_jobs (topic, dead_at DESC, id DESC);
CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_jobs_reason_dead_at_idx ON push.dead_jobs (reason, dead_at DESC, id DESC);

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (9, '0009_operator_truth.sql') ON CONFLICT (version) DO NOTHING;
