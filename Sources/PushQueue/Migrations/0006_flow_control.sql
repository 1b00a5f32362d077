-- PushWorker schema, version 6: fleet-wide flow control in the queue.
--
-- * coalesce_key (latest wins): of the due pending jobs sharing a key, only the newest (highest id) is sent;
--   the claim marks the older ones `superseded` (with superseded_by) in the same statement, never sent.
-- * push.pauses: jobs matching a row (credential and/or topic; NULL = any) are not claimed.
-- * push.rate_limits: a fleet-wide send schedule per (credential, topic): the claim gives each matching job
--   a send time one interval (1 / per_second) after the previous one, and claims at most `burst` ahead.
-- * Dead-token suppression needs no schema: the claim joins push.invalid_tokens.

ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS coalesce_key text;
ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS superseded_by bigint;
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS coalesce_key text;

ALTER TABLE push.jobs DROP CONSTRAINT IF EXISTS state_must_be_pending_running_or_delivered;
ALTER TABLE push.jobs DROP CONSTRAINT IF EXISTS state_must_be_pending_running_delivered_or_superseded;
ALTER TABLE push.jobs ADD CONSTRAINT state_must_be_pending_running_delivered_or_superseded
    CHECK (state IN ('pending', 'running', 'delivered', 'superseded')) NOT VALID;
ALTER TABLE push.jobs DROP CONSTRAINT IF EXISTS coalesce_key_must_be_1_to_255_bytes;
ALTER TABLE push.jobs ADD CONSTRAINT coalesce_key_must_be_1_to_255_bytes
    CHECK (coalesce_key IS NULL OR octet_length(coalesce_key) BETWEEN 1 AND 255) NOT VALID;

CREATE TABLE IF NOT EXISTS push.pauses (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    credential  text,
    topic       text,
    reason      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text        NOT NULL DEFAULT current_user,
    CONSTRAINT pause_reason_must_not_be_empty CHECK (reason <> ''),
    CONSTRAINT one_pause_per_credential_and_topic UNIQUE NULLS NOT DISTINCT (credential, topic)
);

CREATE TABLE IF NOT EXISTS push.rate_limits (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    credential  text,
    topic       text,
    per_second  numeric     NOT NULL,
    burst       integer     NOT NULL,
    -- The schedule's tail: the earliest time the next matching job may be sent. The claim takes jobs while
    -- their send times fall within burst / per_second of now, and moves this on by one interval per job.
    next_send_at timestamptz NOT NULL DEFAULT now(),
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text        NOT NULL DEFAULT current_user,
    CONSTRAINT per_second_must_be_positive CHECK (per_second > 0),
    CONSTRAINT burst_must_be_at_least_1 CHECK (burst >= 1),
    CONSTRAINT one_limit_per_credential_and_topic UNIQUE NULLS NOT DISTINCT (credential, topic)
);

-- The producer trigger: superseded_by is the worker's column too.
CREATE OR REPLACE FUNCTION push.jobs_before_insert() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF current_setting('push.internal_insert', true) = 'on'
       AND pg_has_role(current_user,
                       (SELECT c.relowner FROM pg_catalog.pg_class AS c WHERE c.oid = 'push.jobs'::regclass),
                       'MEMBER') THEN
        RETURN NEW;
    END IF;
    IF push.apns_id_spent(NEW.apns_id) THEN
        RETURN NULL;
    END IF;
    NEW.state := 'pending';
    NEW.attempts := 0;
    NEW.transport_retries := 0;
    NEW.status := NULL;
    NEW.reason := NULL;
    NEW.trap_ids := '{}';
    NEW.apns_unique_id := NULL;
    NEW.created_at := now();
    NEW.first_attempt_at := NULL;
    NEW.last_attempt_at := NULL;
    NEW.delivered_at := NULL;
    NEW.latency_ms := NULL;
    NEW.locked_by := NULL;
    NEW.locked_until := NULL;
    NEW.history := '[]';
    NEW.superseded_by := NULL;
    RETURN NEW;
END
$$;

-- The constraints above were added NOT VALID (a brief lock, no scan); each is validated in a transaction of
-- its own, which lets producers insert meanwhile. The indexes are built without blocking writes.
-- `push-worker migrate` runs what follows outside a transaction, one statement at a time (psql: without -1).
-- push:outside-transaction
ALTER TABLE push.jobs VALIDATE CONSTRAINT state_must_be_pending_running_delivered_or_superseded;
ALTER TABLE push.jobs VALIDATE CONSTRAINT coalesce_key_must_be_1_to_255_bytes;

-- "Is there a newer due job with my key?": one probe per candidate that has a key.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_coalesce_idx
    ON push.jobs (coalesce_key, id) WHERE state = 'pending' AND coalesce_key IS NOT NULL;
-- Retention of superseded jobs (terminal, like delivered ones).
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_superseded_idx ON push.jobs (created_at) WHERE state = 'superseded';

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
CREATE TABLE IF NOT EXISTS push.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO push.schema_migrations (version, name) VALUES (6, '0006_flow_control.sql') ON CONFLICT (version) DO NOTHING;
