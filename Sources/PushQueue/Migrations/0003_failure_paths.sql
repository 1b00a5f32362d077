-- PushWorker schema, version 3: failure paths.
--
-- * transport_retries: unknown outcomes (connection lost mid-request, stream reset, deadline) have a
--   budget of their own, apart from the priority-aware retry stretch, which is about APNs throttling a token.
-- * push.workers: one row per live worker process with its heartbeat. The reaper returns a job to
--   pending only when the worker holding it is gone (its heartbeat is stale), so a worker that merely
--   lost Postgres for a while never has its jobs sent a second time by another.
-- * push.append_history: history entries with repeats collapsed and the length capped, so a job that is
--   requeued for hours does not grow its row without bound.

ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS transport_retries smallint NOT NULL DEFAULT 0;
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS transport_retries smallint NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS push.workers (
    worker_id    text        PRIMARY KEY,
    host         text        NOT NULL DEFAULT '',
    pid          integer     NOT NULL DEFAULT 0,
    credentials  text[]      NOT NULL DEFAULT '{}',
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    -- Set by a clean stop; the row stays so "last seen holding credential X" survives a restart.
    stopped_at   timestamptz
);

-- Running jobs by holder: the reaper's lookup.
CREATE INDEX IF NOT EXISTS jobs_running_by_worker_idx ON push.jobs (locked_by) WHERE state = 'running';

CREATE OR REPLACE FUNCTION push.append_history(history jsonb, entry jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        -- The same uncounted requeue again (APNs unreachable, credential paused): count it on the last entry.
        WHEN entry->>'outcome' = 'requeue' AND jsonb_array_length(history) > 0
             AND history->-1->>'outcome' = 'requeue'
             AND (history->-1->>'reason') IS NOT DISTINCT FROM (entry->>'reason')
        THEN (history - (-1)) || jsonb_build_array(
                 entry || jsonb_build_object('repeats', coalesce((history->-1->>'repeats')::int, 1) + 1,
                                             'first_at', coalesce(history->-1->'first_at', history->-1->'at')))
        -- At most 100 entries: keep the first 20 and the newest 79, with a marker between.
        WHEN jsonb_array_length(history) >= 100
        THEN (SELECT jsonb_agg(e ORDER BY n) FROM jsonb_array_elements(history) WITH ORDINALITY AS x(e, n) WHERE n <= 20)
             || jsonb_build_array(jsonb_build_object('outcome', 'history_trimmed'))
             || (SELECT jsonb_agg(e ORDER BY n) FROM jsonb_array_elements(history) WITH ORDINALITY AS x(e, n)
                  WHERE n > jsonb_array_length(history) - 78 AND coalesce(e->>'outcome', '') <> 'history_trimmed')
             || jsonb_build_array(entry)
        ELSE history || jsonb_build_array(entry)
    END
$$;

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
CREATE TABLE IF NOT EXISTS push.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO push.schema_migrations (version, name) VALUES (3, '0003_failure_paths.sql') ON CONFLICT (version) DO NOTHING;
