-- PushWorker schema, version 8: the fleet keeps working whatever a producer or a neighbour does.
--
-- * push.apns_ids, the apns_id ledger: every apns_id ever enqueued, written by the INSERT trigger and kept
--   through dead letters, replay and retention (forgotten `run --apns-id-memory` after its job was created,
--   once neither a job nor a dead letter holds it). An INSERT whose apns_id is in the ledger is skipped, as
--   ON CONFLICT DO NOTHING would skip it. Before this, the trigger took FOR KEY SHARE on the live job to
--   see where its apns_id went; a producer that re-enqueued in-flight jobs and left its transaction open
--   then held every dead-letter move behind it, and through them the outcome writes, lease extension and
--   heartbeats of every worker. The ledger's primary key makes the check race-free without touching a job.
-- * push.coalesce_marks: latest wins as a high-water mark per (topic, environment, coalesce_key): the
--   highest id of the key ever claimed. A job below it is never sent, whatever it was doing when the newer
--   one was claimed (waiting, scheduled for a retry, committed later by a slow transaction).
-- * push.workers.session_tracked: the worker's Postgres sessions carry its id as application_name, so the
--   reaper can tell a worker that is gone (no session left) from one that is frozen or cut off.
--
-- Nothing here rewrites or locks push.jobs beyond reading it: producers never wait on this file.

CREATE TABLE IF NOT EXISTS push.apns_ids (
    apns_id    uuid        PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);
-- The ledger is written in creation order: a block range index finds the old rows to forget for a few pages.
CREATE INDEX IF NOT EXISTS apns_ids_created_at_brin ON push.apns_ids USING brin (created_at);

-- Whether an apns_id is spent: in the ledger. Kept for callers of schema 4 to 7; it no longer locks a job.
CREATE OR REPLACE FUNCTION push.apns_id_spent(spent uuid) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM push.apns_ids AS a WHERE a.apns_id = spent)
        OR EXISTS (SELECT 1 FROM push.retired_apns_ids AS r WHERE r.apns_id = spent)
$$;

-- Writes the ledger row of a producer's apns_id; false when the apns_id is already there (the INSERT is
-- then skipped). SECURITY DEFINER: a producer role needs no right on the ledger. Two producers inserting
-- the same apns_id at once: the second waits for the first's transaction (the primary key), never for a
-- worker.
CREATE OR REPLACE FUNCTION push.claim_apns_id(fresh uuid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO push.apns_ids (apns_id) VALUES (fresh) ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;

CREATE OR REPLACE FUNCTION push.jobs_before_insert() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF current_setting('push.internal_insert', true) = 'on'
       AND pg_has_role(current_user,
                       (SELECT c.relowner FROM pg_catalog.pg_class AS c WHERE c.oid = 'push.jobs'::regclass),
                       'MEMBER') THEN
        -- The worker's own insert (replay): its apns_id joins the ledger if it is new (a fresh one).
        PERFORM push.claim_apns_id(NEW.apns_id);
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
    RETURN NEW;
END
$$;

-- Every apns_id already held: live jobs, dead letters, and the retired ids of schema 4 to 7.
INSERT INTO push.apns_ids (apns_id, created_at) SELECT apns_id, created_at FROM push.jobs ON CONFLICT DO NOTHING;
INSERT INTO push.apns_ids (apns_id, created_at) SELECT apns_id, created_at FROM push.dead_jobs ON CONFLICT DO NOTHING;
INSERT INTO push.apns_ids (apns_id, created_at)
SELECT apns_id, retired_at FROM push.retired_apns_ids ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS push.coalesce_marks (
    topic        text        NOT NULL,
    environment  text        NOT NULL,
    coalesce_key text        NOT NULL,
    -- The highest id of this key ever claimed: every job of the key below it ends superseded, unsent.
    high_id      bigint      NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, environment, coalesce_key)
);

ALTER TABLE push.workers ADD COLUMN IF NOT EXISTS session_tracked boolean NOT NULL DEFAULT false;

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (8, '0008_fleet.sql') ON CONFLICT (version) DO NOTHING;
