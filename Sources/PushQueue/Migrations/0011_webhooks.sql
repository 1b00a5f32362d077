-- PushWorker schema, version 11: outcomes pushed, not polled (CONTRACT.md 1c), the durable half.
--
-- * push.webhooks: a receiver's URL, the events it takes (delivered, dead, superseded, token_invalid), an
--   optional topic, and the file holding its signing secret (the secret itself never enters the database).
-- * push.webhook_deliveries: the outbox. The statement that writes a job's outcome inserts a delivery for
--   every hook it matches, in the same statement: a crash loses neither the outcome nor its notification.
--   Deliveries are claimed like jobs (SKIP LOCKED), retried with backoff, and dead after 24 hours.

CREATE TABLE IF NOT EXISTS push.webhooks (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    url             text        NOT NULL,
    events          text[]      NOT NULL,
    topic           text,
    secret_file     text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      text        NOT NULL DEFAULT current_user,
    -- A receiver that answered 410 Gone, or an operator: no more deliveries are made for it.
    disabled_at     timestamptz,
    disabled_reason text,
    CONSTRAINT webhook_url_must_be_http_or_https
        CHECK (url ~ '^https?://[^/?#[:space:]]+' AND octet_length(url) <= 2048),
    CONSTRAINT webhook_events_are_delivered_dead_superseded_or_token_invalid
        CHECK (cardinality(events) > 0 AND events <@ ARRAY['delivered', 'dead', 'superseded', 'token_invalid']),
    CONSTRAINT webhook_secret_file_must_be_an_absolute_path
        CHECK (left(secret_file, 1) = '/')
);

CREATE TABLE IF NOT EXISTS push.webhook_deliveries (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id   bigint      NOT NULL REFERENCES push.webhooks (id) ON DELETE CASCADE,
    event        text        NOT NULL,
    job_id       bigint      NOT NULL,
    -- The JSON POSTed, fixed when the outcome was written: job_id, apns_id, platform, topic, state, status,
    -- reason, trap_ids, at.
    body         jsonb       NOT NULL,
    state        text        NOT NULL DEFAULT 'pending',
    attempts     integer     NOT NULL DEFAULT 0,
    run_at       timestamptz NOT NULL DEFAULT now(),
    locked_by    text,
    locked_until timestamptz,
    last_status  integer,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz,
    CONSTRAINT webhook_delivery_state_must_be_pending_running_delivered_or_dead
        CHECK (state IN ('pending', 'running', 'delivered', 'dead'))
);

CREATE INDEX IF NOT EXISTS webhook_deliveries_due_idx ON push.webhook_deliveries (run_at) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS webhook_deliveries_by_hook_idx ON push.webhook_deliveries (webhook_id, state);

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (11, '0011_webhooks.sql') ON CONFLICT (version) DO NOTHING;
