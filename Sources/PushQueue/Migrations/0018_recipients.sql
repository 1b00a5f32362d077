-- Schema 18: jobs addressed to a person. A job may name `recipient` instead of a device token or a channel:
-- when a worker claims it, it fans out to every live `device` token of that recipient in push.devices for its
-- topic and platform, one child job per token (`parent_id`), each with its own apns_id derived from the
-- parent's and the token, and the parent ends `fanned_out` with its children's ids (`children`). A recipient
-- with no live device makes the parent a dead letter with reason NoDevice. The fan-out is one statement: a
-- worker that dies before it commits leaves the parent to be claimed again, and one that commits leaves
-- nothing to do twice (a child per parent and token at most, by the unique index below).

ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS recipient text;
ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS parent_id bigint;
ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS children bigint[];
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS recipient text;
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS parent_id bigint;

ALTER TABLE push.jobs
    DROP CONSTRAINT IF EXISTS exactly_one_of_device_token_or_channel_id,
    DROP CONSTRAINT IF EXISTS exactly_one_of_device_token_channel_id_or_recipient,
    ADD CONSTRAINT exactly_one_of_device_token_channel_id_or_recipient
        CHECK (num_nonnulls(device_token, channel_id, recipient) = 1) NOT VALID,
    DROP CONSTRAINT IF EXISTS recipient_must_be_1_to_255_bytes_no_control_characters,
    ADD CONSTRAINT recipient_must_be_1_to_255_bytes_no_control_characters
        CHECK (recipient IS NULL OR (octet_length(recipient) BETWEEN 1 AND 255 AND recipient !~ '[[:cntrl:]]'))
        NOT VALID,
    DROP CONSTRAINT IF EXISTS state_must_be_pending_running_delivered_superseded_or_cancelled,
    DROP CONSTRAINT IF EXISTS state_must_be_a_job_state,
    ADD CONSTRAINT state_must_be_a_job_state
        CHECK (state IN ('pending', 'running', 'delivered', 'superseded', 'cancelled', 'fanned_out')) NOT VALID;

COMMENT ON CONSTRAINT exactly_one_of_device_token_channel_id_or_recipient ON push.jobs IS
    'a job goes to one device_token, one broadcast channel_id, or every live device of one recipient (push.devices)';
COMMENT ON CONSTRAINT state_must_be_a_job_state ON push.jobs IS
    'pending, running, delivered, superseded, cancelled, or fanned_out (a recipient''s job, once its children exist)';

-- The producers' insert trigger of schema 8, restated: a producer's row is a new job, never a child (the
-- worker's fan-out inserts those, as its own insert).
CREATE OR REPLACE FUNCTION push.jobs_before_insert() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF current_setting('push.internal_insert', true) = 'on'
       AND pg_has_role(current_user,
                       (SELECT c.relowner FROM pg_catalog.pg_class AS c WHERE c.oid = 'push.jobs'::regclass),
                       'MEMBER') THEN
        -- The worker's own insert (replay, revive, fan-out): its apns_id joins the ledger if it is new.
        PERFORM push.claim_apns_id(NEW.apns_id);
        RETURN NEW;
    END IF;
    IF NOT push.claim_apns_id(NEW.apns_id) THEN
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
    NEW.parent_id := NULL;
    NEW.children := NULL;
    RETURN NEW;
END
$$;

-- A child's apns_id: the same for the same parent and token, whoever fans out and however often.
CREATE OR REPLACE FUNCTION push.child_apns_id(parent uuid, token text) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT md5(parent::text || '/' || token)::uuid $$;

-- Built and checked without blocking producers; `push-worker migrate` runs what follows outside a transaction,
-- one statement at a time (psql: without -1).
-- push:outside-transaction
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_one_child_per_parent_and_token
    ON push.jobs (parent_id, device_token) WHERE parent_id IS NOT NULL;
-- The fan-out's latest-wins look for a newer job of a recipient's key, in any state a worker may be at.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_recipient_key_idx
    ON push.jobs (coalesce_key, topic, environment, id) WHERE recipient IS NOT NULL AND coalesce_key IS NOT NULL;
ALTER TABLE push.jobs VALIDATE CONSTRAINT exactly_one_of_device_token_channel_id_or_recipient;
ALTER TABLE push.jobs VALIDATE CONSTRAINT recipient_must_be_1_to_255_bytes_no_control_characters;
ALTER TABLE push.jobs VALIDATE CONSTRAINT state_must_be_a_job_state;

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (18, '0018_recipients.sql') ON CONFLICT (version) DO NOTHING;
