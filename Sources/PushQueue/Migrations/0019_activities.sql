-- Schema 19: Live Activities as rows with a life. A producer names an activity (`push.activities`: topic and
-- its own activity_id, with the recipient whose push-to-start tokens start it, or a broadcast channel) and
-- enqueues its events as jobs that name `activity_id` instead of a token: `start`, `update` and `end` in
-- the payload's `aps.event`, with `aps.timestamp`. When a worker claims such a job it routes it, under the
-- activity's row lock: a start to the recipient's push-to-start tokens, an update or an end to the activity's
-- own token (push.devices kind `activity`) or its channel, as child jobs (`parent_id`), the parent ending
-- `fanned_out`. An event whose timestamp is not newer than the last one routed ends superseded with reason
-- StaleTimestamp, every event after the activity's end ActivityEnded, and no event is routed while the
-- previous event's request is in flight: the timestamps a device receives only grow. Priority-10 updates
-- past the topic's hourly budget (push.activity_budgets, 12 by default) go at priority 5 with trap MS015.

CREATE TABLE IF NOT EXISTS push.activities (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic text NOT NULL,
    activity_id text NOT NULL,
    recipient text,
    channel_id text,
    -- A channel the worker creates for the activity (its updates and end go through it), with Apple's
    -- message-storage policy (0: none, 1: the most recent message); the channel's APNs environment and
    -- credential (to create it, and delete it after the end).
    wants_channel boolean NOT NULL DEFAULT false,
    channel_storage integer NOT NULL DEFAULT 0,
    environment text NOT NULL DEFAULT 'production',
    credential text NOT NULL DEFAULT 'default',
    state text NOT NULL DEFAULT 'requested',
    -- The newest aps.timestamp routed (seconds since 1970), its event, when, and the jobs that carry it.
    last_timestamp bigint,
    last_event text,
    last_routed_at timestamptz,
    children bigint[] NOT NULL DEFAULT '{}',
    ended_at timestamptz,
    dismissal_at timestamptz,
    -- The channel deleted (after the dismissal), and a worker's lease on deleting it.
    channel_deleted_at timestamptz,
    channel_cleanup_until timestamptz,
    -- Priority-10 updates routed in the hour that began at budget_hour.
    budget_hour timestamptz,
    budget_used integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT one_activity_per_topic_and_activity_id UNIQUE (topic, activity_id),
    CONSTRAINT activity_state_must_be_requested_started_or_ended CHECK (state IN ('requested', 'started', 'ended')),
    CONSTRAINT activity_id_must_be_1_to_255_bytes_no_control_characters
        CHECK (octet_length(activity_id) BETWEEN 1 AND 255 AND activity_id !~ '[[:cntrl:]]'),
    CONSTRAINT activity_recipient_must_be_1_to_255_bytes_no_control_characters
        CHECK (recipient IS NULL OR (octet_length(recipient) BETWEEN 1 AND 255 AND recipient !~ '[[:cntrl:]]')),
    CONSTRAINT activity_channel_id_must_be_base64_up_to_128_characters
        CHECK (channel_id IS NULL OR channel_id ~ '^[A-Za-z0-9+/=_-]{1,128}$'),
    CONSTRAINT activity_channel_storage_must_be_0_or_1 CHECK (channel_storage IN (0, 1)),
    CONSTRAINT activity_environment_must_be_production_or_development
        CHECK (environment IN ('production', 'development')),
    CONSTRAINT activity_topic_must_be_a_bundle_id
        CHECK (octet_length(topic) BETWEEN 1 AND 255 AND left(topic, 1) NOT IN ('.', '-', '_')
               AND ltrim(topic, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-_') = '')
);

COMMENT ON TABLE push.activities IS
    'Live Activities: one row per (topic, activity_id), inserted by producers (or by the first job naming it); state, last_timestamp and children kept by the worker as it routes the activity''s events';

-- Activities waiting for the channel they asked for.
CREATE INDEX IF NOT EXISTS activities_channels_to_create_idx ON push.activities (id)
    WHERE wants_channel AND channel_id IS NULL AND state <> 'ended';
-- The channels of ended activities whose dismissal passed, for the workers to delete (Apple allows an app
-- 10,000 channels per environment); and those in use, for the count.
CREATE INDEX IF NOT EXISTS activities_channels_to_delete_idx ON push.activities (dismissal_at)
    WHERE state = 'ended' AND channel_id IS NOT NULL AND channel_deleted_at IS NULL;

-- Each topic's hourly budget of priority-10 updates per activity (`push-worker activities budget`).
CREATE TABLE IF NOT EXISTS push.activity_budgets (
    topic text PRIMARY KEY,
    per_hour integer NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT activity_budget_must_be_1_to_10000_an_hour CHECK (per_hour BETWEEN 1 AND 10000)
);

ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS activity_id text;
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS activity_id text;

ALTER TABLE push.jobs
    DROP CONSTRAINT IF EXISTS exactly_one_of_device_token_channel_id_or_recipient,
    DROP CONSTRAINT IF EXISTS exactly_one_of_device_token_channel_id_recipient_or_activity_id,
    ADD CONSTRAINT exactly_one_of_device_token_channel_id_recipient_or_activity_id
        CHECK (num_nonnulls(device_token, channel_id, recipient, activity_id) = 1) NOT VALID,
    DROP CONSTRAINT IF EXISTS activity_jobs_must_be_liveactivity_with_1_to_255_byte_ids,
    ADD CONSTRAINT activity_jobs_must_be_liveactivity_with_1_to_255_byte_ids
        CHECK (activity_id IS NULL
               OR (push_type = 'liveactivity' AND platform = 'apns'
                   AND octet_length(activity_id) BETWEEN 1 AND 255 AND activity_id !~ '[[:cntrl:]]')) NOT VALID;

COMMENT ON CONSTRAINT exactly_one_of_device_token_channel_id_recipient_or_activity_id ON push.jobs IS
    'a job goes to one device_token, one broadcast channel_id, every live device of one recipient (push.devices), or one Live Activity (push.activities)';
COMMENT ON CONSTRAINT activity_jobs_must_be_liveactivity_with_1_to_255_byte_ids ON push.jobs IS
    'a job naming activity_id is an APNs Live Activity event: push_type liveactivity, platform apns';

-- Checked without blocking producers; `push-worker migrate` runs what follows outside a transaction, one
-- statement at a time (psql: without -1).
-- push:outside-transaction
-- An activity's events in order (`push-worker activities show`).
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_activity_idx ON push.jobs (topic, activity_id, id)
    WHERE activity_id IS NOT NULL;
-- An activity's end still in the queue (the routing holds back what is newer than it, wherever it is claimed).
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_activity_end_waiting_idx ON push.jobs (topic, activity_id, id)
    WHERE activity_id IS NOT NULL AND state IN ('pending', 'running') AND (payload -> 'aps' ->> 'event') = 'end';
-- An activity's start still in the queue (no end enqueued after it goes first, wherever it is claimed).
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_activity_start_waiting_idx ON push.jobs (topic, activity_id, id)
    WHERE activity_id IS NOT NULL AND state IN ('pending', 'running') AND (payload -> 'aps' ->> 'event') = 'start';
ALTER TABLE push.jobs VALIDATE CONSTRAINT exactly_one_of_device_token_channel_id_recipient_or_activity_id;
ALTER TABLE push.jobs VALIDATE CONSTRAINT activity_jobs_must_be_liveactivity_with_1_to_255_byte_ids;

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (19, '0019_activities.sql') ON CONFLICT (version) DO NOTHING;
