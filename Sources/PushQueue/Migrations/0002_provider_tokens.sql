-- PushWorker schema, version 2: provider tokens shared by every worker process.
--
-- APNs answers TooManyProviderTokenUpdates when a key's token is refreshed more often than every 20
-- minutes, which a fleet of workers (or one restarted after a crash) does if each mints its own. Workers
-- adopt the newest token of a key from here and store the ones they mint. The JWT is a bearer token
-- valid for an hour: it is as sensitive as the jobs themselves; keep database access to the workers.

CREATE TABLE push.provider_tokens (
    team_id    text        NOT NULL,
    key_id     text        NOT NULL,
    jwt        text        NOT NULL,
    issued_at  timestamptz NOT NULL,
    PRIMARY KEY (team_id, key_id)
);

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
CREATE TABLE IF NOT EXISTS push.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO push.schema_migrations (version, name) VALUES (2, '0002_provider_tokens.sql') ON CONFLICT (version) DO NOTHING;
