-- Schema 17: the device registry. Producers keep their users' tokens here with a plain upsert, and the worker
-- keeps it true: a token a provider calls invalid is marked so, and an upsert of it afterwards (the app
-- registered again) clears the mark.
--
-- A token is unique per (platform, topic, token): the upsert moves a rotated or re-assigned token to its newest
-- recipient (latest wins). `registered_at` is when it was last upserted: a provider's word that it is invalid
-- counts only if given after that (APNs' 410 timestamp is when it learnt the token was gone; an app that
-- registered again since has a live token).

CREATE TABLE IF NOT EXISTS push.devices (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The producer's own key for a person or account (`user:42`).
    recipient       text        NOT NULL,
    platform        text        NOT NULL DEFAULT 'apns',
    -- The bundle id (APNs) or package name (FCM), as on jobs.
    topic           text        NOT NULL,
    token           text        NOT NULL,
    -- device: alerts and background pushes; push_to_start: starts Live Activities; activity: one Live
    -- Activity's update token (with activity_id).
    kind            text        NOT NULL DEFAULT 'device',
    activity_id     text,
    -- production, development, or auto (the producer does not know the build). FCM's is fcm.
    environment     text        NOT NULL DEFAULT 'production',
    registered_at   timestamptz NOT NULL DEFAULT now(),
    -- Who upserted it (the role): a producer role reads and moves only its own rows.
    registered_by   name        NOT NULL DEFAULT current_user,
    -- Set by the worker from the provider's answer; NULL while the token is live.
    invalidated_at  timestamptz,
    invalidated_reason text,
    CONSTRAINT device_token_is_unique_per_platform_and_topic UNIQUE (platform, topic, token),
    CONSTRAINT device_platform_must_be_apns_or_fcm CHECK (platform IN ('apns', 'fcm')),
    CONSTRAINT device_recipient_must_be_1_to_255_bytes_no_control_characters
        CHECK (octet_length(recipient) BETWEEN 1 AND 255 AND recipient !~ '[[:cntrl:]]'),
    CONSTRAINT device_kind_must_be_device_push_to_start_or_activity
        CHECK (kind IN ('device', 'push_to_start', 'activity')),
    CONSTRAINT device_activity_tokens_name_their_activity
        CHECK ((kind = 'activity') = (activity_id IS NOT NULL)
               AND (activity_id IS NULL OR (octet_length(activity_id) BETWEEN 1 AND 255
                                            AND activity_id !~ '[[:cntrl:]]'))),
    CONSTRAINT device_live_activity_tokens_are_apns_only CHECK (platform = 'apns' OR kind = 'device'),
    CONSTRAINT device_environment_must_be_production_development_or_auto
        CHECK ((platform = 'apns' AND environment IN ('production', 'development', 'auto'))
               OR (platform = 'fcm' AND environment = 'fcm')),
    CONSTRAINT device_apns_token_must_be_hex_of_16_to_200_bytes
        CHECK (platform <> 'apns'
               OR (octet_length(token) BETWEEN 32 AND 400 AND octet_length(token) % 2 = 0
                   AND ltrim(token, '0123456789ABCDEFabcdef') = '')),
    CONSTRAINT device_fcm_token_must_be_printable_ascii_up_to_4096_bytes
        CHECK (platform <> 'fcm' OR (octet_length(token) BETWEEN 1 AND 4096 AND token !~ '[^!-~]')),
    CONSTRAINT device_topic_must_be_a_bundle_id_or_package_name
        CHECK (octet_length(topic) BETWEEN 1 AND 255 AND left(topic, 1) NOT IN ('.', '-', '_')
               AND ltrim(topic, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-_') = '')
);

COMMENT ON TABLE push.devices IS
    'The device registry: one row per token, upserted by producers ON CONFLICT (platform, topic, token); invalidated_at set by the worker from the provider''s answer and cleared by the next upsert';
COMMENT ON CONSTRAINT device_token_is_unique_per_platform_and_topic ON push.devices IS
    'upsert with ON CONFLICT (platform, topic, token) DO UPDATE: a rotated or re-assigned token moves to its newest recipient';
COMMENT ON CONSTRAINT device_apns_token_must_be_hex_of_16_to_200_bytes ON push.devices IS
    'an APNs token as the app got it from didRegisterForRemoteNotificationsWithDeviceToken, hex-encoded';
COMMENT ON CONSTRAINT device_activity_tokens_name_their_activity ON push.devices IS
    'kind activity (a Live Activity''s update token) names its activity_id; other kinds name none';

CREATE INDEX IF NOT EXISTS devices_by_recipient ON push.devices (recipient, topic, platform);

-- Every upsert is a registration: it stamps registered_at (the statement's time) and clears a mark the worker
-- set (the app registered again), and takes the row for the role that made it. The worker's own updates
-- (marking a token invalid, from push.device_invalidated below, which runs as the table's owner) say so with
-- push.internal_update; only the owner's say is taken, so a producer session cannot set it to keep its rows'
-- registration as it likes.
CREATE OR REPLACE FUNCTION push.device_registered() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('push.internal_update', true) = 'on'
       AND pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = 'push.devices'::regclass), 'MEMBER')
    THEN
        RETURN NEW;
    END IF;
    NEW.registered_at := statement_timestamp();
    NEW.registered_by := current_user;
    NEW.invalidated_at := NULL;
    NEW.invalidated_reason := NULL;
    RETURN NEW;
END $$;

DROP TRIGGER IF EXISTS device_registered ON push.devices;
CREATE TRIGGER device_registered BEFORE INSERT OR UPDATE ON push.devices
    FOR EACH ROW EXECUTE FUNCTION push.device_registered();

-- The worker's word: every token-invalid answer it records in push.invalid_tokens (APNs 410, BadDeviceToken,
-- DeviceTokenNotForTopic; FCM UNREGISTERED, a token-invalid INVALID_ARGUMENT) marks the device of that
-- token, topic and environment, unless the device registered again after the provider's instant. A device
-- of environment auto is marked by any answer but BadDeviceToken (which in one environment says only that
-- the token belongs to the other).
-- It runs inside the worker's outcome write, so it never waits: a device a producer's transaction holds (an
-- upsert in flight: the app registering again) is skipped, and that upsert leaves it live. A producer
-- transaction left open can then not hold up an outcome.
-- SECURITY DEFINER (as the owner, whom row-level security does not bind), so it is executable by no one but
-- the owner and refuses to run for any table but push.invalid_tokens.
CREATE OR REPLACE FUNCTION push.device_invalidated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_RELID <> 'push.invalid_tokens'::regclass THEN
        RAISE EXCEPTION 'push.device_invalidated() marks devices from push.invalid_tokens only';
    END IF;
    PERFORM set_config('push.internal_update', 'on', true);
    UPDATE push.devices AS d
       SET invalidated_at = NEW.invalidated_at, invalidated_reason = NEW.reason
     WHERE d.id IN (
        SELECT x.id FROM push.devices AS x
         WHERE x.topic = NEW.topic AND x.token = NEW.device_token
           AND x.platform = CASE WHEN NEW.environment = 'fcm' THEN 'fcm' ELSE 'apns' END
           AND (x.environment = NEW.environment OR (x.environment = 'auto' AND NEW.reason <> 'BadDeviceToken'))
           AND x.registered_at <= NEW.invalidated_at
           AND x.invalidated_at IS DISTINCT FROM NEW.invalidated_at
           FOR UPDATE SKIP LOCKED);
    PERFORM set_config('push.internal_update', 'off', true);
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION push.device_invalidated() FROM PUBLIC;

DROP TRIGGER IF EXISTS device_invalidated ON push.invalid_tokens;
CREATE TRIGGER device_invalidated AFTER INSERT OR UPDATE ON push.invalid_tokens
    FOR EACH ROW EXECUTE FUNCTION push.device_invalidated();

-- Row-level security: every role that may read the table sees every row (the worker, operators), unless a
-- restrictive policy for a producer role says otherwise: the producer recipe (docs/operations.md) adds one, so
-- that role reads and moves only the devices it registered. The owner is never bound.
ALTER TABLE push.devices ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS devices_for_every_reader ON push.devices;
CREATE POLICY devices_for_every_reader ON push.devices USING (true) WITH CHECK (true);

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (17, '0017_devices.sql') ON CONFLICT (version) DO NOTHING;
