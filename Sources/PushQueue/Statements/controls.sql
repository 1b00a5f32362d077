-- push.pauses and push.rate_limits, the operator's controls, and cancelling jobs (JobQueue+Controls.swift).
-- Each statement starts at its `-- name:` line; the comment lines right after it describe it.

-- name: pause
-- A pause of this scope (NULL: any), replacing one there (its reason updated).
INSERT INTO push.pauses (credential, topic, reason) VALUES (:credential, :topic, :reason)
ON CONFLICT ON CONSTRAINT one_pause_per_credential_and_topic
DO UPDATE SET reason = excluded.reason, created_at = now(), created_by = current_user
RETURNING credential, topic, reason, created_at, created_by

-- name: resume
-- Lifts the pause of exactly this scope.
DELETE FROM push.pauses
 WHERE credential IS NOT DISTINCT FROM :credential::text AND topic IS NOT DISTINCT FROM :topic::text
RETURNING 1

-- name: pauses
-- Every pause, oldest first; with :counting_jobs, how many pending jobs each holds.
SELECT p.credential, p.topic, p.reason, p.created_at, p.created_by,
       CASE WHEN :counting_jobs THEN (
           SELECT count(*) FROM push.jobs AS j
            WHERE j.state = 'pending' AND (p.credential IS NULL OR j.credential = p.credential)
              AND (p.topic IS NULL OR j.topic = p.topic)) END
  FROM push.pauses AS p ORDER BY p.created_at, p.id

-- name: set_rate_limit
-- The rate limit of this scope (replacing one there) with a full bucket, and what a claim could take now.
INSERT INTO push.rate_limits (credential, topic, per_second, burst)
VALUES (:credential, :topic, :per_second::float8::numeric, :burst)
ON CONFLICT ON CONSTRAINT one_limit_per_credential_and_topic
DO UPDATE SET per_second = excluded.per_second, burst = excluded.burst, created_at = now(),
              created_by = current_user
RETURNING credential, topic, per_second::float8, burst, {{available_now}}

-- name: clear_rate_limit
-- Removes the rate limit of exactly this scope.
DELETE FROM push.rate_limits
 WHERE credential IS NOT DISTINCT FROM :credential::text AND topic IS NOT DISTINCT FROM :topic::text
RETURNING 1

-- name: rate_limits
-- Every rate limit with what a claim could take under it now (read only: nothing is scheduled).
SELECT credential, topic, per_second::float8, burst, {{available_now}}
  FROM push.rate_limits ORDER BY credential NULLS FIRST, topic NULLS FIRST

-- name: wake_workers
-- Every listening worker claims at once instead of at its next poll.
NOTIFY push_jobs

-- name: cancelled_among
-- Which of the jobs a worker holds an operator cancelled (each heartbeat asks).
SELECT id FROM push.jobs WHERE id = ANY (:ids::bigint[]) AND state = 'cancelled'

-- name: cancel
-- Cancels pending and running jobs by id (a recipient's job: its children not yet sent too), or by
-- coalesce_key (within :topic if given; a recipient's job of the key: its children too); tells the workers holding any (NOTIFY `cancel:<ids>`); says of every
-- other asked-for id what it is.
WITH targets AS (
    SELECT j.id, j.state FROM push.jobs AS j
     WHERE (j.id = ANY (:ids::bigint[]) OR j.parent_id = ANY (:ids::bigint[])
            OR (:coalesce_key::text IS NOT NULL AND j.coalesce_key = :coalesce_key
                AND (:topic::text IS NULL OR j.topic = :topic))
            -- The children of recipients' jobs of the key (theirs is the key and a token's fingerprint).
            OR j.parent_id = ANY (ARRAY(
                SELECT r.id FROM push.jobs AS r
                 WHERE :coalesce_key::text IS NOT NULL AND r.coalesce_key = :coalesce_key
                   AND r.recipient IS NOT NULL AND r.state IN ('pending', 'running', 'fanned_out')
                   AND (:topic::text IS NULL OR r.topic = :topic))))
       AND j.state IN ('pending', 'running')
     FOR NO KEY UPDATE
), cancelled AS (
    UPDATE push.jobs AS j
       SET state = 'cancelled', reason = 'Cancelled', locked_until = NULL,
           history = push.append_history(j.history, jsonb_build_object(
               'outcome', 'cancelled', 'at', now(), 'by', current_user, 'was', t.state))
      FROM targets AS t
     WHERE j.id = t.id
    RETURNING j.id, t.state AS was
), notified AS (
    -- NOTIFY payloads stop at 8,000 bytes: 300 ids (at most 20 characters each) a notification.
    -- The prefix is JobQueue.cancelNotificationPrefix.
    SELECT pg_notify('push_jobs', 'cancel:' || string_agg(id::text, ','))
      FROM (SELECT id, (row_number() OVER (ORDER BY id) - 1) / 300 AS part
              FROM cancelled WHERE was = 'running') AS c
     GROUP BY part
)
SELECT c.id, c.was, (SELECT count(*) FROM notified) FROM cancelled AS c
UNION ALL
SELECT a.id, coalesce(j.state, CASE WHEN d.id IS NOT NULL THEN 'dead letter' END), 0
  FROM unnest(:ids::bigint[]) AS a (id)
  LEFT JOIN push.jobs AS j ON j.id = a.id
  LEFT JOIN push.dead_jobs AS d ON d.id = a.id
 WHERE a.id NOT IN (SELECT id FROM cancelled)
