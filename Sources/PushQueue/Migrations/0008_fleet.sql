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
-- Nothing here rewrites push.jobs or locks it beyond reading: producers never wait on this file.

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

-- Any rate sends, however slow, down to one job every 11.6 days (`limits set` refuses less); slower rates
-- made send times overflow. NOT VALID: rows from before are left as they are.
ALTER TABLE push.rate_limits DROP CONSTRAINT IF EXISTS per_second_must_be_at_least_0_000001;
ALTER TABLE push.rate_limits ADD CONSTRAINT per_second_must_be_at_least_0_000001 CHECK (per_second >= 0.000001) NOT VALID;

-- The ledger's backfill runs once the trigger above has committed, so every job enqueued from then on
-- writes its own row. First wait (up to 10 minutes) for the transactions that began before it, which may
-- still insert with the old trigger; then copy every apns_id already held: live jobs, dead letters, and the
-- retired ids of schema 4 to 7. Each statement is idempotent and commits alone; none blocks a producer.
-- push:outside-transaction
DO $$
DECLARE
    horizon xid8 := pg_snapshot_xmax(pg_current_snapshot());
    deadline timestamptz := clock_timestamp() + interval '10 minutes';
BEGIN
    WHILE pg_snapshot_xmin(pg_current_snapshot()) < horizon AND clock_timestamp() < deadline LOOP
        PERFORM pg_sleep(0.2);
    END LOOP;
    IF pg_snapshot_xmin(pg_current_snapshot()) < horizon THEN
        RAISE WARNING 'a transaction older than this migration is still open after 10 minutes; jobs it inserts are not in push.apns_ids until they are re-enqueued';
    END IF;
END
$$;
INSERT INTO push.apns_ids (apns_id, created_at) SELECT apns_id, created_at FROM push.jobs ON CONFLICT DO NOTHING;
INSERT INTO push.apns_ids (apns_id, created_at) SELECT apns_id, created_at FROM push.dead_jobs ON CONFLICT DO NOTHING;
INSERT INTO push.apns_ids (apns_id, created_at)
SELECT apns_id, retired_at FROM push.retired_apns_ids ON CONFLICT DO NOTHING;

-- The claim reads one range per (credential, environment, topic, send priority): a paused topic or a
-- limit with no room is left out as a whole range instead of being filtered row by row (300,000 due rows of
-- a paused topic cost every claim 240-400 ms). Built without blocking producers.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_claim_by_topic_idx
    ON push.jobs (credential, environment, topic, send_priority, run_at, id) WHERE state = 'pending';
-- The claim indexes this one replaces: the priority index of schema 1 (read by no worker since schema 7,
-- which announced this drop) and the credential index of schema 4. Each gives a topic's range the same
-- order, so the claim's generic plan could pick either (the narrower looks cheaper) and then walk every
-- due row of the other topics ahead of it: 110-140 ms a claim behind 300,000 paused or limited jobs, 9 ms
-- on this index. One claim index instead of two also costs every job one index write less. Workers of
-- schema 7 still claim correctly without them, but read a credential's whole backlog per claim: roll them.
DROP INDEX CONCURRENTLY IF EXISTS push.jobs_claim_idx;
DROP INDEX CONCURRENTLY IF EXISTS push.jobs_claim_by_credential_idx;

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (8, '0008_fleet.sql') ON CONFLICT (version) DO NOTHING;
