-- PushWorker schema, version 10: Android through Firebase Cloud Messaging (CONTRACT.md 1b).
--
-- * `platform` ('apns' or 'fcm') on jobs, dead letters and invalid tokens. Every existing row is 'apns':
--   a column with a constant default is added without rewriting the table.
-- * The producer rules per platform, each a constraint whose name is the rule: the hex device token and
--   the bundle-id topic are APNs' only; an FCM registration token is printable ASCII up to 4,096 bytes, an
--   FCM topic an Android package name; push_type, channel_id and priority 1 are APNs' only.
-- * FCM has no sandbox: an fcm job's `environment` is 'fcm' (the insert trigger sets it for a job that left the
--   default). Every (credential, environment) the claim walks, pause and backoff then keeps the platforms
--   apart, so a team names its APNs key and its Firebase service account both `default`; so do the
--   coalesce scope and the invalid-token key, which include the environment.
-- * `provider_message_id`: the message `name` FCM returns for a delivered job.
-- * push.invalid_tokens names the platform of each dead token. Its key, and the coalesce marks' key, stay
--   as they were (workers of schema 9 name them in ON CONFLICT): an fcm row's environment 'fcm' already keeps
--   the platforms apart in both, so an iOS app and its Android app may share an id and a coalesce key.
--
-- The constraints are added NOT VALID (a brief lock, no scan) and validated after the transaction, while
-- producers insert; every row they check was already valid under the APNs rules they replace.

ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS platform text NOT NULL DEFAULT 'apns';
ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS provider_message_id text;
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS platform text NOT NULL DEFAULT 'apns';
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS provider_message_id text;
ALTER TABLE push.invalid_tokens ADD COLUMN IF NOT EXISTS platform text NOT NULL DEFAULT 'apns';

ALTER TABLE push.jobs
    DROP CONSTRAINT IF EXISTS platform_must_be_apns_or_fcm,
    ADD CONSTRAINT platform_must_be_apns_or_fcm CHECK (platform IN ('apns', 'fcm')) NOT VALID,
    DROP CONSTRAINT device_token_must_be_hex_of_16_to_200_bytes,
    ADD CONSTRAINT device_token_must_be_hex_of_16_to_200_bytes
        CHECK (platform <> 'apns' OR device_token IS NULL
               OR (octet_length(device_token) BETWEEN 32 AND 400 AND octet_length(device_token) % 2 = 0
                   AND ltrim(device_token, '0123456789ABCDEFabcdef') = '')) NOT VALID,
    DROP CONSTRAINT topic_must_be_a_bundle_id_up_to_255_bytes,
    ADD CONSTRAINT topic_must_be_a_bundle_id_up_to_255_bytes
        CHECK (platform <> 'apns'
               OR (octet_length(topic) BETWEEN 1 AND 255 AND left(topic, 1) NOT IN ('.', '-')
                   AND ltrim(topic, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-') = '')) NOT VALID,
    DROP CONSTRAINT IF EXISTS fcm_device_token_must_be_printable_ascii_up_to_4096_bytes,
    ADD CONSTRAINT fcm_device_token_must_be_printable_ascii_up_to_4096_bytes
        CHECK (platform <> 'fcm' OR device_token IS NULL
               OR (octet_length(device_token) BETWEEN 1 AND 4096 AND device_token !~ '[^!-~]')) NOT VALID,
    DROP CONSTRAINT IF EXISTS fcm_topic_must_be_an_android_package_name_up_to_255_bytes,
    ADD CONSTRAINT fcm_topic_must_be_an_android_package_name_up_to_255_bytes
        CHECK (platform <> 'fcm'
               OR (octet_length(topic) BETWEEN 1 AND 255 AND left(topic, 1) NOT IN ('.', '_')
                   AND ltrim(topic, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._') = '')) NOT VALID,
    DROP CONSTRAINT IF EXISTS fcm_jobs_take_a_device_token_not_a_channel_id,
    ADD CONSTRAINT fcm_jobs_take_a_device_token_not_a_channel_id
        CHECK (platform <> 'fcm' OR channel_id IS NULL) NOT VALID,
    DROP CONSTRAINT IF EXISTS fcm_jobs_take_no_push_type,
    ADD CONSTRAINT fcm_jobs_take_no_push_type CHECK (platform <> 'fcm' OR push_type = 'alert') NOT VALID,
    DROP CONSTRAINT environment_must_be_production_or_development,
    ADD CONSTRAINT environment_must_be_production_or_development
        CHECK (environment IN ('production', 'development') OR (platform = 'fcm' AND environment = 'fcm')) NOT VALID,
    DROP CONSTRAINT IF EXISTS fcm_jobs_have_no_environment,
    ADD CONSTRAINT fcm_jobs_have_no_environment CHECK (platform <> 'fcm' OR environment = 'fcm') NOT VALID,
    DROP CONSTRAINT IF EXISTS fcm_priority_must_be_10_or_5,
    ADD CONSTRAINT fcm_priority_must_be_10_or_5
        CHECK (platform <> 'fcm' OR priority IS NULL OR priority IN (5, 10)) NOT VALID;

COMMENT ON CONSTRAINT fcm_device_token_must_be_printable_ascii_up_to_4096_bytes ON push.jobs IS
    'an FCM registration token exactly as the app received it: printable ASCII without spaces, at most 4096 bytes';
COMMENT ON CONSTRAINT fcm_topic_must_be_an_android_package_name_up_to_255_bytes ON push.jobs IS
    'for platform fcm, topic is the Android package name (com.example.app): letters, digits, dots and underscores';
COMMENT ON CONSTRAINT fcm_jobs_take_no_push_type ON push.jobs IS
    'push_type is Apple''s apns-push-type; leave it unset for platform fcm';
COMMENT ON CONSTRAINT fcm_jobs_have_no_environment ON push.jobs IS
    'FCM has no sandbox: leave environment unset for platform fcm (it reads fcm)';
COMMENT ON CONSTRAINT fcm_priority_must_be_10_or_5 ON push.jobs IS
    'FCM has two priorities: 10 (HIGH) and 5 (NORMAL); priority 1 is APNs'' only';

-- Replay asks this before inserting a dead letter again: the same expressions as the constraints, per
-- platform. (The eight-argument form stays for workers of schema 9 until they are replaced.)
CREATE OR REPLACE FUNCTION push.broken_rule(
    platform text, environment text, topic text, device_token text, channel_id text, payload jsonb,
    push_type text, priority smallint, collapse_id text, credential text, run_at timestamptz,
    expires_at timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN platform NOT IN ('apns', 'fcm') THEN 'platform_must_be_apns_or_fcm'
        WHEN platform = 'fcm' AND device_token IS NOT NULL
             AND NOT (octet_length(device_token) BETWEEN 1 AND 4096 AND device_token !~ '[^!-~]')
            THEN 'fcm_device_token_must_be_printable_ascii_up_to_4096_bytes'
        WHEN platform = 'fcm'
             AND NOT (octet_length(topic) BETWEEN 1 AND 255 AND left(topic, 1) NOT IN ('.', '_')
                      AND ltrim(topic, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._') = '')
            THEN 'fcm_topic_must_be_an_android_package_name_up_to_255_bytes'
        WHEN platform = 'fcm' AND channel_id IS NOT NULL THEN 'fcm_jobs_take_a_device_token_not_a_channel_id'
        WHEN platform = 'fcm' AND push_type <> 'alert' THEN 'fcm_jobs_take_no_push_type'
        WHEN platform = 'fcm' AND priority NOT IN (5, 10) THEN 'fcm_priority_must_be_10_or_5'
        WHEN platform = 'fcm' AND environment <> 'fcm' THEN 'fcm_jobs_have_no_environment'
        WHEN platform = 'fcm'
            THEN push.broken_rule('com.example.app', NULL, NULL, payload, collapse_id, credential, run_at,
                                  expires_at)
        ELSE push.broken_rule(topic, device_token, channel_id, payload, collapse_id, credential, run_at,
                              expires_at)
    END
$$;

-- An fcm job's environment is 'fcm' when the producer left the default, and provider_message_id is the
-- worker's: a trigger of its own beside the producers' insert trigger of schema 8 (which it does not restate).
CREATE OR REPLACE FUNCTION push.jobs_platform_before_insert() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.platform = 'fcm' AND NEW.environment = 'production' THEN
        NEW.environment := 'fcm';
    END IF;
    NEW.provider_message_id := NULL;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS jobs_platform_before_insert ON push.jobs;
CREATE TRIGGER jobs_platform_before_insert
    BEFORE INSERT ON push.jobs
    FOR EACH ROW EXECUTE FUNCTION push.jobs_platform_before_insert();

-- push:outside-transaction
ALTER TABLE push.jobs VALIDATE CONSTRAINT platform_must_be_apns_or_fcm;
ALTER TABLE push.jobs VALIDATE CONSTRAINT environment_must_be_production_or_development;
ALTER TABLE push.jobs VALIDATE CONSTRAINT fcm_jobs_have_no_environment;
ALTER TABLE push.jobs VALIDATE CONSTRAINT device_token_must_be_hex_of_16_to_200_bytes;
ALTER TABLE push.jobs VALIDATE CONSTRAINT topic_must_be_a_bundle_id_up_to_255_bytes;
ALTER TABLE push.jobs VALIDATE CONSTRAINT fcm_device_token_must_be_printable_ascii_up_to_4096_bytes;
ALTER TABLE push.jobs VALIDATE CONSTRAINT fcm_topic_must_be_an_android_package_name_up_to_255_bytes;
ALTER TABLE push.jobs VALIDATE CONSTRAINT fcm_jobs_take_a_device_token_not_a_channel_id;
ALTER TABLE push.jobs VALIDATE CONSTRAINT fcm_jobs_take_no_push_type;
ALTER TABLE push.jobs VALIDATE CONSTRAINT fcm_priority_must_be_10_or_5;
-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (10, '0010_fcm.sql') ON CONFLICT (version) DO NOTHING;
