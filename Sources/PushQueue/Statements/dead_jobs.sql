-- push.dead_jobs: the purges (JobQueue+DeadLetters.swift). The filtered reads and the replay, whose WHERE is
-- one condition per filter given (each served by its own index), are assembled in Swift from
-- QueueOperations.appendFilter.
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
