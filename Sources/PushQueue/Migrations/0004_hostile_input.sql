-- PushWorker schema, version 4: the schema defends itself against hostile and mistaken producers.
--
-- * Sizes and formats are checked at INSERT, each by a constraint whose name is the rule: payload bytes,
--   token hex of 16 to 200 bytes, bundle-id topics, base64 channel ids, no control characters in the
--   values that become HTTP/2 headers, finite times.
-- * Producers cannot set the worker's columns: a trigger resets them on INSERT (state, attempts, outcome,
--   lease, history, created_at), and `id` is always generated. A producer role that cannot even read
--   the provider tokens is in docs/operations.md.
-- * An apns_id is unique across the job's whole life: an INSERT whose apns_id belongs to a dead letter,
--   or to a job pruned less than the retention window ago (push.retired_apns_ids), is skipped as if
--   ON CONFLICT DO NOTHING had met it, so an outbox retry never sends a push twice.
-- * The claim reads one range per (credential, send priority): backlog that is not due, or that belongs
--   to a credential the worker does not claim, costs nothing.
-- Jobs already queued that break the new rules are moved to the dead letters first, with a sentence,
-- so the constraints never stop a claim.

INSERT INTO push.dead_jobs (
    id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
    collapse_id, expires_at, run_at, apns_id, max_attempts, attempts, status, reason, trap_ids,
    apns_unique_id, created_at, first_attempt_at, last_attempt_at, latency_ms, error, history,
    transport_retries)
SELECT id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
       collapse_id, expires_at, run_at, apns_id, max_attempts, least(attempts, 32767), status,
       'InvalidJob', coalesce(array_remove(trap_ids, NULL), '{}'), apns_unique_id, created_at,
       first_attempt_at, last_attempt_at, latency_ms,
       'the job breaks a rule added in schema version 4 (sizes, formats, control characters, finite times): fix the producer and insert it again.',
       history, transport_retries
  FROM push.jobs
 WHERE state <> 'delivered'
   AND NOT (octet_length(payload::text) <= 16384
        AND (device_token IS NULL OR device_token ~ '^([0-9A-Fa-f]{2}){16,200}$')
        AND octet_length(topic) <= 255 AND topic ~ '^[A-Za-z0-9][A-Za-z0-9.-]*$'
        AND (channel_id IS NULL OR channel_id ~ '^[A-Za-z0-9+/=_-]{1,128}$')
        AND (collapse_id IS NULL OR collapse_id !~ '[[:cntrl:]]')
        AND octet_length(credential) <= 64 AND credential ~ '^[A-Za-z0-9._-]+$'
        AND isfinite(run_at) AND (expires_at IS NULL OR isfinite(expires_at)))
ON CONFLICT (id) DO NOTHING;

DELETE FROM push.jobs AS j
 WHERE state <> 'delivered' AND EXISTS (SELECT 1 FROM push.dead_jobs AS d WHERE d.id = j.id);

-- NOT VALID: delivered rows from before are not rescanned; every new or updated row is checked.
ALTER TABLE push.jobs
    ADD CONSTRAINT payload_must_be_at_most_16384_bytes
        CHECK (octet_length(payload::text) <= 16384) NOT VALID,
    ADD CONSTRAINT device_token_must_be_hex_of_16_to_200_bytes
        CHECK (device_token IS NULL OR device_token ~ '^([0-9A-Fa-f]{2}){16,200}$') NOT VALID,
    ADD CONSTRAINT topic_must_be_a_bundle_id_up_to_255_bytes
        CHECK (octet_length(topic) <= 255 AND topic ~ '^[A-Za-z0-9][A-Za-z0-9.-]*$') NOT VALID,
    ADD CONSTRAINT channel_id_must_be_base64_up_to_128_characters
        CHECK (channel_id IS NULL OR channel_id ~ '^[A-Za-z0-9+/=_-]{1,128}$') NOT VALID,
    ADD CONSTRAINT collapse_id_must_not_contain_control_characters
        CHECK (collapse_id IS NULL OR collapse_id !~ '[[:cntrl:]]') NOT VALID,
    ADD CONSTRAINT credential_must_be_a_name_up_to_64_bytes
        CHECK (octet_length(credential) <= 64 AND credential ~ '^[A-Za-z0-9._-]+$') NOT VALID,
    ADD CONSTRAINT run_at_must_be_finite
        CHECK (isfinite(run_at)) NOT VALID,
    ADD CONSTRAINT expires_at_must_be_finite
        CHECK (expires_at IS NULL OR isfinite(expires_at)) NOT VALID;

COMMENT ON CONSTRAINT topic_must_be_a_bundle_id_up_to_255_bytes ON push.jobs IS
    'topic is the bare bundle id: letters, digits, dots and hyphens, at most 255 bytes';
COMMENT ON CONSTRAINT credential_must_be_a_name_up_to_64_bytes ON push.jobs IS
    'credential names a configured key: letters, digits, dots, hyphens and underscores, at most 64 bytes';

-- `id` is the worker's: an explicit id is refused (replay inserts with OVERRIDING SYSTEM VALUE).
ALTER TABLE push.jobs ALTER COLUMN id SET GENERATED ALWAYS;

-- apns_ids of jobs pruned from push.jobs, remembered for the retention window of `run --apns-id-memory`.
CREATE TABLE IF NOT EXISTS push.retired_apns_ids (
    apns_id    uuid        PRIMARY KEY,
    retired_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS retired_apns_ids_retired_at_idx ON push.retired_apns_ids (retired_at);
CREATE INDEX IF NOT EXISTS dead_jobs_apns_id_idx ON push.dead_jobs (apns_id);

-- On every producer INSERT: the worker's columns take their defaults whatever the producer wrote, and a
-- row whose apns_id is already spent (a dead letter, a recently pruned job) is skipped.
-- The worker's own inserts (replay) set push.internal_insert for their transaction.
-- SECURITY DEFINER: a producer role needs no access to push.dead_jobs or push.retired_apns_ids for the check.
CREATE OR REPLACE FUNCTION push.jobs_before_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF current_setting('push.internal_insert', true) = 'on' THEN
        RETURN NEW;
    END IF;
    IF EXISTS (SELECT 1 FROM push.dead_jobs WHERE apns_id = NEW.apns_id)
       OR EXISTS (SELECT 1 FROM push.retired_apns_ids WHERE apns_id = NEW.apns_id) THEN
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
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS jobs_before_insert ON push.jobs;
CREATE TRIGGER jobs_before_insert
    BEFORE INSERT ON push.jobs
    FOR EACH ROW EXECUTE FUNCTION push.jobs_before_insert();

-- The claim: one range per (credential, send priority), due jobs first.
CREATE INDEX IF NOT EXISTS jobs_claim_by_credential_idx
    ON push.jobs (credential, send_priority, run_at, id) WHERE state = 'pending';


-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
CREATE TABLE IF NOT EXISTS push.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO push.schema_migrations (version, name) VALUES (4, '0004_hostile_input.sql') ON CONFLICT (version) DO NOTHING;
