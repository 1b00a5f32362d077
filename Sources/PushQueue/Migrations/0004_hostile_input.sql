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
-- * The claim reads one range per (credential, environment, send priority): backlog that is not due, or
--   that belongs to a credential or environment the worker does not claim now, costs nothing.
-- Jobs already queued that break the new rules are moved to the dead letters first, with a sentence,
-- so the constraints never stop a claim; producers wait on a table lock meanwhile.

-- Producers wait while the schema changes: a row that breaks a rule, inserted between the move below and
-- the new constraints, would stay pending and make every claim fail.
-- (In a DO block so that psql without -1 can apply the file too; `push-worker migrate` and `psql -1` hold
-- the lock until the whole file has run.)
DO $$ BEGIN LOCK TABLE push.jobs IN SHARE ROW EXCLUSIVE MODE; END $$;

-- The first rule a job's producer columns break, by its constraint's name; NULL when it breaks none. The
-- constraints below say the same; replay asks this first, so one bad dead letter never aborts a batch.
CREATE OR REPLACE FUNCTION push.broken_rule(
    topic text, device_token text, channel_id text, payload jsonb, collapse_id text, credential text,
    run_at timestamptz, expires_at timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN octet_length(payload::text) > 16384 THEN 'payload_must_be_at_most_16384_bytes'
        WHEN device_token IS NOT NULL AND device_token !~ '^([0-9A-Fa-f]{2}){16,200}$'
            THEN 'device_token_must_be_hex_of_16_to_200_bytes'
        WHEN octet_length(topic) > 255 OR topic !~ '^[A-Za-z0-9][A-Za-z0-9.-]*$'
            THEN 'topic_must_be_a_bundle_id_up_to_255_bytes'
        WHEN channel_id IS NOT NULL AND channel_id !~ '^[A-Za-z0-9+/=_-]{1,128}$'
            THEN 'channel_id_must_be_base64_up_to_128_characters'
        WHEN collapse_id IS NOT NULL AND collapse_id ~ '[[:cntrl:]]'
            THEN 'collapse_id_must_not_contain_control_characters'
        WHEN octet_length(credential) > 64 OR credential ~ '[[:cntrl:]]'
            THEN 'credential_must_be_up_to_64_bytes_without_control_characters'
        WHEN NOT isfinite(run_at) THEN 'run_at_must_be_finite'
        WHEN expires_at IS NOT NULL AND NOT isfinite(expires_at) THEN 'expires_at_must_be_finite'
    END
$$;

-- Queued jobs that break a new rule become dead letters with a sentence naming it. A dead letter already
-- holding the id (an explicit id from before) is merged into, as the worker does: nothing is dropped.
WITH broken AS (
    DELETE FROM push.jobs AS j
     WHERE j.state <> 'delivered'
       AND push.broken_rule(j.topic, j.device_token, j.channel_id, j.payload, j.collapse_id, j.credential,
                            j.run_at, j.expires_at) IS NOT NULL
    RETURNING j.*
)
INSERT INTO push.dead_jobs (
    id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
    collapse_id, expires_at, run_at, apns_id, max_attempts, attempts, status, reason, trap_ids,
    apns_unique_id, created_at, first_attempt_at, last_attempt_at, latency_ms, error, history,
    transport_retries)
SELECT id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
       collapse_id, expires_at, run_at, apns_id, max_attempts, attempts, status,
       'InvalidJob', coalesce(array_remove(trap_ids, NULL), '{}'), apns_unique_id, created_at,
       first_attempt_at, last_attempt_at, latency_ms,
       'the job breaks ' || push.broken_rule(topic, device_token, channel_id, payload, collapse_id, credential,
                                             run_at, expires_at)
           || ', a rule schema version 4 checks at INSERT: fix the producer and insert it again.',
       history, transport_retries
  FROM broken
ON CONFLICT (id) DO UPDATE SET
    topic = excluded.topic, device_token = excluded.device_token, channel_id = excluded.channel_id,
    payload = excluded.payload, push_type = excluded.push_type, priority = excluded.priority,
    environment = excluded.environment, credential = excluded.credential, collapse_id = excluded.collapse_id,
    expires_at = excluded.expires_at, run_at = excluded.run_at, apns_id = excluded.apns_id,
    max_attempts = excluded.max_attempts, attempts = excluded.attempts,
    transport_retries = excluded.transport_retries, status = excluded.status, reason = excluded.reason,
    trap_ids = push.merge_trap_ids(dead_jobs.trap_ids, excluded.trap_ids),
    apns_unique_id = excluded.apns_unique_id, created_at = excluded.created_at,
    first_attempt_at = excluded.first_attempt_at, last_attempt_at = excluded.last_attempt_at,
    latency_ms = excluded.latency_ms, dead_at = excluded.dead_at,
    error = excluded.error || ' (An older dead letter with the same id, apns_id ' || dead_jobs.apns_id
            || ', was merged into this one; its history comes first.)',
    history = dead_jobs.history || jsonb_build_array(jsonb_build_object('outcome', 'merged_dead_letter',
            'previous_apns_id', dead_jobs.apns_id, 'previous_reason', dead_jobs.reason)) || excluded.history;

-- NOT VALID: delivered rows from before are not rescanned; every new or updated row is checked.
-- Dropped first: a migrator that died before recording this file runs it again.
ALTER TABLE push.jobs
    DROP CONSTRAINT IF EXISTS payload_must_be_at_most_16384_bytes,
    DROP CONSTRAINT IF EXISTS device_token_must_be_hex_of_16_to_200_bytes,
    DROP CONSTRAINT IF EXISTS topic_must_be_a_bundle_id_up_to_255_bytes,
    DROP CONSTRAINT IF EXISTS channel_id_must_be_base64_up_to_128_characters,
    DROP CONSTRAINT IF EXISTS collapse_id_must_not_contain_control_characters,
    DROP CONSTRAINT IF EXISTS credential_must_be_up_to_64_bytes_without_control_characters,
    DROP CONSTRAINT IF EXISTS run_at_must_be_finite,
    DROP CONSTRAINT IF EXISTS expires_at_must_be_finite,
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
    ADD CONSTRAINT credential_must_be_up_to_64_bytes_without_control_characters
        CHECK (octet_length(credential) <= 64 AND credential !~ '[[:cntrl:]]') NOT VALID,
    ADD CONSTRAINT run_at_must_be_finite
        CHECK (isfinite(run_at)) NOT VALID,
    ADD CONSTRAINT expires_at_must_be_finite
        CHECK (expires_at IS NULL OR isfinite(expires_at)) NOT VALID;

COMMENT ON CONSTRAINT topic_must_be_a_bundle_id_up_to_255_bytes ON push.jobs IS
    'topic is the bare bundle id: letters, digits, dots and hyphens, at most 255 bytes';

-- `id` is the worker's: an explicit id is refused (replay inserts with OVERRIDING SYSTEM VALUE).
ALTER TABLE push.jobs ALTER COLUMN id SET GENERATED ALWAYS;

-- apns_ids of jobs pruned from push.jobs, remembered for the retention window of `run --apns-id-memory`.
CREATE TABLE IF NOT EXISTS push.retired_apns_ids (
    apns_id    uuid        PRIMARY KEY,
    retired_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS retired_apns_ids_retired_at_idx ON push.retired_apns_ids (retired_at);
CREATE INDEX IF NOT EXISTS dead_jobs_apns_id_idx ON push.dead_jobs (apns_id);

-- Whether an apns_id is spent: held by a dead letter, or by a job pruned within the memory window. A worker
-- moving the job with this apns_id to the dead letters (or pruning it) right now holds its row: wait for
-- that to commit first, so the answer sees where the apns_id went. SECURITY DEFINER: a producer role
-- needs no access to push.dead_jobs or push.retired_apns_ids, nor the UPDATE right a row lock takes.
CREATE OR REPLACE FUNCTION push.apns_id_spent(spent uuid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM 1 FROM push.jobs AS j WHERE j.apns_id = spent FOR KEY SHARE;
    RETURN EXISTS (SELECT 1 FROM push.dead_jobs AS d WHERE d.apns_id = spent)
        OR EXISTS (SELECT 1 FROM push.retired_apns_ids AS r WHERE r.apns_id = spent);
END
$$;

-- On every producer INSERT: the worker's columns take their defaults whatever the producer wrote, and a
-- row whose apns_id is already spent is skipped, as ON CONFLICT DO NOTHING would skip it.
-- The worker's own inserts (replay) set push.internal_insert for their transaction; the setting counts
-- only for a role that is a member of the table's owner (the trigger runs as the inserting role), so a
-- producer cannot switch this off.
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
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS jobs_before_insert ON push.jobs;
CREATE TRIGGER jobs_before_insert
    BEFORE INSERT ON push.jobs
    FOR EACH ROW EXECUTE FUNCTION push.jobs_before_insert();

-- Built without blocking producers; `push-worker migrate` runs it outside the transaction above.
-- push:outside-transaction
-- The claim: one range per (credential, environment, send priority), due jobs first; an environment or a
-- credential that is paused or unreachable is left out of the ranges, not filtered row by row.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_claim_by_credential_idx
    ON push.jobs (credential, environment, send_priority, run_at, id) WHERE state = 'pending';

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
CREATE TABLE IF NOT EXISTS push.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO push.schema_migrations (version, name) VALUES (4, '0004_hostile_input.sql') ON CONFLICT (version) DO NOTHING;
