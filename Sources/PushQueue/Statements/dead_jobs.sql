-- push.dead_jobs: the operator's reads (JobQueue+DeadLetters.swift, JobQueue+Console.swift), the replay and the
-- purges. The reads and the replay take the filter of dead_letter_filter.sql.
-- Each statement starts at its `-- name:` line; the comment lines right after it describe it.

-- name: purge_older
-- Dead letters older than the age, :batch_size at a time. The apns_id stays spent in push.apns_ids.
DELETE FROM push.dead_jobs WHERE id IN (
    SELECT id FROM push.dead_jobs WHERE dead_at < now() - make_interval(secs => :age_seconds)
     LIMIT :batch_size FOR UPDATE SKIP LOCKED)
RETURNING id

-- name: purge_died_before
-- Dead letters that died before :cutoff_micros (microseconds since 1970, exact: what a preview counted),
-- :batch_size at a time.
DELETE FROM push.dead_jobs WHERE id IN (
    SELECT id FROM push.dead_jobs WHERE dead_at < timestamptz 'epoch' + :cutoff_micros::int8 * interval '1 microsecond'
     LIMIT :batch_size FOR UPDATE SKIP LOCKED)
RETURNING id

-- name: list
-- The dead letters the filter selects, newest first, at most :limit.
SELECT {{job_columns}}, j.status, j.reason, j.apns_unique_id, j.dead_at, j.error, j.history::text AS history_json,
       to_jsonb(j)::text AS row_json
  FROM push.dead_jobs AS j
 WHERE {{dead_letter_filter}}
 ORDER BY j.dead_at DESC, j.id DESC LIMIT :limit

-- name: page
-- A page of the dead letters the filter selects, newest first, after the cursor (:cursor_micros, :cursor_id;
-- NULL: the first page). Keyset pagination: each page costs the same however deep.
SELECT j.id, j.dead_at, (extract(epoch FROM j.dead_at) * 1000000)::int8, j.reason, j.status, j.trap_ids,
       j.topic, j.credential, j.push_type, j.attempts, j.device_token, j.channel_id, j.error
  FROM push.dead_jobs AS j
 WHERE {{dead_letter_filter}}
   AND (:cursor_micros::int8 IS NULL
        OR (j.dead_at <= timestamptz 'epoch' + :cursor_micros::int8 * interval '1 microsecond'
            AND (j.dead_at < timestamptz 'epoch' + :cursor_micros::int8 * interval '1 microsecond'
                 OR j.id < :cursor_id::int8)))
 ORDER BY j.dead_at DESC, j.id DESC LIMIT :limit

-- name: groups
-- The dead letters the filter selects grouped by reason and the trap id they died with (their last), the
-- largest groups first. Bounded: the groups read at most the newest :cap + 1 matching dead letters through the
-- dead_at index (an index per filter keeps a filtered read as short), so a page costs the same at 1,000,000
-- dead letters as at 10,000; past the cap the counts are of the newest :cap, and say so.
WITH sample AS MATERIALIZED (
    SELECT j.trap_ids[array_upper(j.trap_ids, 1)] AS trap, j.reason, j.dead_at
      FROM push.dead_jobs AS j WHERE {{dead_letter_filter}}
     -- dead_at alone: ties do not change the counts, and the plain dead_at index serves the order.
     ORDER BY j.dead_at DESC LIMIT :cap::int8 + 1
), capped AS (
    SELECT * FROM sample ORDER BY dead_at DESC LIMIT :cap::int8
)
SELECT g.trap, g.reason, g.n, g.newest, (SELECT count(*) FROM sample) > :cap::int8,
       -- The newest one's sentence: found again by its dead_at through the index (carrying its id through the
       -- aggregate costs a third more on 100,000 rows).
       coalesce((SELECT j.error FROM push.dead_jobs AS j
                  WHERE j.dead_at = g.newest AND j.reason = g.reason
                    AND j.trap_ids[array_upper(j.trap_ids, 1)] IS NOT DISTINCT FROM g.trap
                    AND {{dead_letter_filter}} LIMIT 1), '')
  FROM (SELECT trap, reason, count(*) AS n, max(dead_at) AS newest FROM capped GROUP BY 1, 2) AS g
 ORDER BY g.n DESC, g.reason, g.trap LIMIT 200

-- name: replay_preview
-- What a replay of the dead letters the filter selects would do (oldest first, at most :limit), moving
-- nothing: id, apns_id, reason, conflicted, expired, broken rule, new id (none), renumbered.
SELECT id, apns_id, reason, conflicted, coalesce(now() + make_interval(secs => :expires_in_seconds::float8),
       expires_at) < now(), broken, NULL::bigint, renumber
  FROM (SELECT id, apns_id, reason, expires_at, broken, {{dead_letter_replay_rank}}
          FROM (SELECT {{dead_letter_replay_candidate}}
                  FROM push.dead_jobs AS j
                 WHERE {{dead_letter_filter}} ORDER BY j.id LIMIT :limit) AS c) AS r
 ORDER BY id

-- name: replay
-- Moves the dead letters the filter selects (oldest first, at most :limit, skipping rows another replay
-- holds) back to push.jobs as pending, due now, attempts, status, reason and trap ids reset, the history kept
-- plus a `replayed` entry, the same apns_id unless :new_apns_id, a new expires_at :expires_in_seconds from now
-- if given. Returns, per dead letter: id, apns_id, reason, conflicted, expired, broken rule, the id it is
-- queued under, renumbered. Run with push.internal_insert on (mark_internal_insert): the producers' INSERT
-- trigger skips an apns_id held by a dead letter and resets the worker's columns.
WITH candidates AS MATERIALIZED (
    SELECT {{dead_letter_replay_candidate}}
      FROM push.dead_jobs AS j
     WHERE {{dead_letter_filter}} ORDER BY j.id LIMIT :limit
     FOR UPDATE OF j SKIP LOCKED
), ranked AS (
    SELECT id, broken, {{dead_letter_replay_rank}}
      FROM candidates
), moved AS (
    DELETE FROM push.dead_jobs AS d USING ranked AS c
     WHERE d.id = c.id AND NOT c.conflicted AND c.broken IS NULL
    RETURNING d.*
), inserted AS (
    -- With a new apns_id, the old one stays spent in push.apns_ids: an outbox retry of it is not sent; the new
    -- one joins the ledger through the insert trigger.
    INSERT INTO push.jobs (
        id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
        collapse_id, expires_at, run_at, apns_id, max_attempts, created_at, history, deliver_once,
        coalesce_key, platform, traceparent, trace_first_span, recipient, parent_id, auto_environment,
        activity_id)
    OVERRIDING SYSTEM VALUE
    -- In id order, so that renumbered jobs of one key keep their order (nextval is volatile: evaluated after
    -- the sort).
    SELECT CASE WHEN c.renumber THEN nextval(pg_get_serial_sequence('push.jobs', 'id')) ELSE m.id END,
           topic, device_token, channel_id, payload, push_type, priority, environment, credential,
           collapse_id, coalesce(now() + make_interval(secs => :expires_in_seconds::float8), expires_at), now(),
           CASE WHEN :new_apns_id THEN gen_random_uuid() ELSE apns_id END,
           max_attempts, created_at,
           history || jsonb_build_array(jsonb_build_object(
               'outcome', 'replayed', 'at', now(), 'dead_reason', reason,
               'previous_apns_id', apns_id, 'attempts_before', attempts)
               || CASE WHEN c.renumber THEN jsonb_build_object('previous_id', m.id) ELSE '{}' END),
           deliver_once, coalesce_key, platform, traceparent, trace_first_span, recipient, parent_id,
           auto_environment, activity_id
      FROM moved AS m JOIN ranked AS c USING (id)
     ORDER BY m.id
    RETURNING id, coalesce((history->-1->>'previous_id')::bigint, id) AS dead_id, apns_id,
              expires_at < now() AS expired
)
SELECT m.id, i.apns_id, m.reason, false, i.expired, NULL::text, i.id, i.id <> m.id
  FROM inserted AS i JOIN moved AS m ON m.id = i.dead_id
UNION ALL
SELECT c.id, NULL, NULL, c.conflicted, NULL, c.broken, NULL, false FROM ranked AS c
 WHERE c.conflicted OR c.broken IS NOT NULL
