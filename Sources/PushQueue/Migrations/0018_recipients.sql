-- Schema 18: jobs addressed to a person. A job may name `recipient` instead of a device token or a channel:
-- when a worker claims it, it fans out to every live `device` token of that recipient in push.devices for its
-- topic and platform, one child job per token (`parent_id`), each with its own apns_id derived from the
-- parent's and the token, and the parent ends `fanned_out` with its children's ids (`children`). A recipient
-- with no live device makes the parent a dead letter with reason NoDevice. The fan-out is one statement: a
-- worker that dies before it commits leaves the parent to be claimed again, and one that commits leaves
-- nothing to do twice (a child per parent and token at most, by the unique index below).
--
-- And `environment = 'auto'` (a producer that does not know the build, on a job or a device): the job is sent
-- to production first (`environment` reads production, `auto_environment` true); APNs' BadDeviceToken there
-- (it processed nothing) sends it once more to development, with the same apns_id, uncounted
-- (`environment` becomes development). The environment that answers is recorded on the device; a device
-- whose both environments answer BadDeviceToken is invalidated.

ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS recipient text;
ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS parent_id bigint;
ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS children bigint[];
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS recipient text;
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS parent_id bigint;
ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS auto_environment boolean NOT NULL DEFAULT false;
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS auto_environment boolean NOT NULL DEFAULT false;

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
        -- The worker's own insert (replay, revive, fan-out): its apns_id joins the ledger if it is new. A
        -- child whose derived apns_id is spent already (that push went out) is skipped.
        IF NOT push.claim_apns_id(NEW.apns_id) AND NEW.parent_id IS NOT NULL THEN
            RETURN NULL;
        END IF;
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

-- Schema 12's platform trigger, restated: an fcm job's environment is 'fcm' when the producer left the
-- default; an apns job's 'auto' is production first, marked auto_environment. A producer's insert starts
-- untraced and unmarked; the worker's own (replay, revive, fan-out) keeps the trace link and the mark.
CREATE OR REPLACE FUNCTION push.jobs_platform_before_insert() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    internal boolean := (current_setting('push.internal_insert', true) = 'on'
        AND pg_has_role(current_user,
                        (SELECT c.relowner FROM pg_catalog.pg_class AS c WHERE c.oid = 'push.jobs'::regclass),
                        'MEMBER')) IS TRUE;
BEGIN
    IF NEW.platform = 'fcm' AND NEW.environment = 'production' THEN
        NEW.environment := 'fcm';
    END IF;
    NEW.provider_message_id := NULL;
    IF NOT internal THEN
        NEW.trace_first_span := NULL;
        NEW.auto_environment := false;
    END IF;
    IF NEW.platform = 'apns' AND NEW.environment = 'auto' THEN
        NEW.environment := 'production';
        NEW.auto_environment := true;
    END IF;
    RETURN NEW;
END
$$;

-- What an 'auto' job's answer teaches the device registry: the environment that answered (`invalid_reason`
-- NULL), or that the other environment refused it too (BadDeviceToken in development after production):
-- the device is invalidated. Only devices still 'auto' are touched; one a producer's transaction holds is
-- skipped (its upsert decides). Called by the worker's outcome write for auto jobs only. SECURITY DEFINER,
-- as push.device_invalidated (schema 17): the registry's trigger takes it as the worker's own update.
CREATE OR REPLACE FUNCTION push.device_environment_answered(
    device_topic text, device_token text, answered text, invalid_reason text, answered_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('push.internal_update', 'on', true);
    UPDATE push.devices AS d
       SET environment = CASE WHEN invalid_reason IS NULL THEN answered ELSE d.environment END,
           invalidated_at = CASE WHEN invalid_reason IS NULL THEN d.invalidated_at ELSE answered_at END,
           invalidated_reason = CASE WHEN invalid_reason IS NULL THEN d.invalidated_reason ELSE invalid_reason END
     WHERE d.id IN (
        SELECT x.id FROM push.devices AS x
         WHERE x.platform = 'apns' AND x.topic = device_topic AND x.token = device_token
           AND x.environment = 'auto' AND x.registered_at <= answered_at
           FOR UPDATE SKIP LOCKED);
    PERFORM set_config('push.internal_update', 'off', true);
    RETURN true;
END $$;
REVOKE ALL ON FUNCTION push.device_environment_answered(text, text, text, text, timestamptz) FROM PUBLIC;

-- A child's apns_id: the same for the same parent and token, whoever fans out and however often.
CREATE OR REPLACE FUNCTION push.child_apns_id(parent uuid, token text) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT md5(parent::text || '/' || token)::uuid $$;

-- Built and checked without blocking producers; `push-worker migrate` runs what follows outside a transaction,
-- one statement at a time (psql: without -1).
-- push:outside-transaction
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_one_child_per_parent_and_token
    ON push.jobs (parent_id, device_token) WHERE parent_id IS NOT NULL;
-- Pruning fanned-out recipients' jobs past the retention (each state its own partial index).
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_fanned_out_idx ON push.jobs (created_at) WHERE state = 'fanned_out';
-- The fan-out's latest-wins look for a newer job of a recipient's key, in any state a worker may be at.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_recipient_key_idx
    ON push.jobs (coalesce_key, topic, environment, id) WHERE recipient IS NOT NULL AND coalesce_key IS NOT NULL;
ALTER TABLE push.jobs VALIDATE CONSTRAINT exactly_one_of_device_token_channel_id_or_recipient;
ALTER TABLE push.jobs VALIDATE CONSTRAINT recipient_must_be_1_to_255_bytes_no_control_characters;
ALTER TABLE push.jobs VALIDATE CONSTRAINT state_must_be_a_job_state;

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (18, '0018_recipients.sql') ON CONFLICT (version) DO NOTHING;
