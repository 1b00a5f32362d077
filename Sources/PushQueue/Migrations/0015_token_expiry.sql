-- Schema 15: a shared provider token says when it expires; keyed jobs are found by key in any state.
--
-- FCM access tokens live as long as the token endpoint says (`expires_in`: an hour at Google, less behind a
-- proxy or a stand-in). A worker that adopted another worker's token assumed an hour, and sent it after it had
-- expired: with 20 s tokens, 90 of 440 sends in 70 s were answered 401. The worker that obtains a token now
-- stores its expiry; the others renew it ahead of that instant. APNs provider tokens leave it NULL (Apple's
-- rule is an age, not an expiry).
ALTER TABLE push.provider_tokens ADD COLUMN IF NOT EXISTS expires_at timestamptz;

-- While a fleet upgrades, a worker from before schema 15 replaces a token without knowing this column: the new
-- token would inherit the old one's expiry. A token changed without its expiry has none (taken for an hour).
CREATE OR REPLACE FUNCTION push.provider_token_expiry_follows_token() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.jwt IS DISTINCT FROM OLD.jwt AND NEW.expires_at IS NOT DISTINCT FROM OLD.expires_at THEN
        NEW.expires_at := NULL;
    END IF;
    RETURN NEW;
END
$$;
DROP TRIGGER IF EXISTS provider_token_expiry_follows_token ON push.provider_tokens;
CREATE TRIGGER provider_token_expiry_follows_token BEFORE UPDATE ON push.provider_tokens
    FOR EACH ROW EXECUTE FUNCTION push.provider_token_expiry_follows_token();

-- The index is built without blocking the workers' writes; `push-worker migrate` runs what follows outside a
-- transaction, one statement at a time (psql: without -1).
-- push:outside-transaction
-- `dead replay` and `jobs revive` ask, for each keyed job, whether a job of its key above it is pending, running or
-- delivered. Only pending rows were indexed by key: 1,000 keyed dead letters beside 120,000 rows took 26.5 s
-- (the primary key read from each dead letter's id upward); 0.65 ms with this index. Keyed rows only.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_keyed_idx
    ON push.jobs (coalesce_key, topic, environment, id) WHERE coalesce_key IS NOT NULL;

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (15, '0015_token_expiry.sql') ON CONFLICT (version) DO NOTHING;
