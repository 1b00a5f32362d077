-- PushWorker schema, version 5: deliver-once.
--
-- * deliver_once: send `apns-expiration: 0`, so APNs makes one delivery attempt and stores nothing for an
--   offline device ("now or never"). expires_at still bounds how long the job may wait in the queue.
--   A broadcast (channel_id) with no expires_at is always sent with 0, which no-storage channels require.

ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS deliver_once boolean NOT NULL DEFAULT false;
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS deliver_once boolean NOT NULL DEFAULT false;

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
CREATE TABLE IF NOT EXISTS push.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO push.schema_migrations (version, name) VALUES (5, '0005_deliver_once.sql') ON CONFLICT (version) DO NOTHING;
