-- push.activities, Live Activities with a life (schema 19), and the routing of their events
-- (JobQueue+Activities.swift): a claimed job naming activity_id is never sent itself; under its activity's
-- row lock it is routed to the activity's tokens or channel as child jobs, or superseded, or claimed again
-- shortly. The rules are PushCore's ActivityRouting; these statements read and write what they decide.
-- Each statement starts at its `-- name:` line; the comment lines right after it describe it.

-- name: ensure
-- The activities of the (:topics, :activity_ids) pairs, created when a job names one no producer inserted.
INSERT INTO push.activities (topic, activity_id)
SELECT DISTINCT x.topic, x.activity_id FROM unnest(:topics::text[], :activity_ids::text[]) AS x (topic, activity_id)
 ORDER BY 1, 2
ON CONFLICT (topic, activity_id) DO NOTHING

-- name: lock
-- The activities of the (:topics, :activity_ids) pairs, locked in id order (two workers routing events of the
-- same activities take them one after the other), with their budget this hour, their last event and its
-- children, and whether the channel they asked for is still to be created.
SELECT a.id, a.topic, a.activity_id, a.state, a.last_timestamp,
       CASE WHEN a.budget_hour > now() - interval '1 hour' THEN a.budget_used ELSE 0 END,
       coalesce((SELECT b.per_hour FROM push.activity_budgets AS b WHERE b.topic = a.topic), 12),
       a.children, a.last_event, a.wants_channel AND a.channel_id IS NULL
  FROM push.activities AS a
 WHERE (a.topic, a.activity_id) IN (SELECT * FROM unnest(:topics::text[], :activity_ids::text[]))
 ORDER BY a.id
   FOR NO KEY UPDATE

-- name: waiting_ends
-- Of the activities :activity_rows (locked by this transaction: read after the lock, so an event committed
-- while it waited is seen), the oldest end and the oldest start still pending or running that none of
-- :held_ids is: the activity, the end's id and aps.timestamp, the start's id.
SELECT a.id, e.id, e.ts, s.id
  FROM push.activities AS a
  LEFT JOIN LATERAL (
    SELECT j.id, j.payload -> 'aps' ->> 'timestamp' AS ts
      FROM push.jobs AS j
     WHERE j.topic = a.topic AND j.activity_id = a.activity_id AND j.state IN ('pending', 'running')
       AND (j.payload -> 'aps' ->> 'event') = 'end' AND NOT (j.id = ANY (:held_ids::bigint[]))
     ORDER BY j.id LIMIT 1) AS e ON true
  LEFT JOIN LATERAL (
    SELECT j.id
      FROM push.jobs AS j
     WHERE j.topic = a.topic AND j.activity_id = a.activity_id AND j.state IN ('pending', 'running')
       AND (j.payload -> 'aps' ->> 'event') = 'start' AND NOT (j.id = ANY (:held_ids::bigint[]))
     ORDER BY j.id LIMIT 1) AS s ON true
 WHERE a.id = ANY (:activity_rows::bigint[]) AND (e.id IS NOT NULL OR s.id IS NOT NULL)

-- name: lock_unsent_children
-- Of the children :ids, those still pending that this transaction can lock: no claim takes them until it
-- ends, and a newer event may supersede them. One not finished (unfinished_children) and not locked here may
-- be in flight.
SELECT id FROM push.jobs WHERE id = ANY (:ids::bigint[]) AND state = 'pending' FOR UPDATE SKIP LOCKED

-- name: unfinished_children
-- Of the children :ids, those pending or running.
SELECT id FROM push.jobs WHERE id = ANY (:ids::bigint[]) AND state IN ('pending', 'running')

-- name: route
-- What ActivityRouting decided, written in one statement, each part fenced like an outcome (id, attempt,
-- :worker_id, still running). Events superseded (:superseded_ids with their reasons and the event that
-- superseded them); unsent children of older events superseded (StaleTimestamp); each routed event
-- (:winner_ids) gets one child per target (:superseded_by 0: by an event routed before; :activity_dismissals
-- -1: the end gave no dismissal date): a start the activity's recipient's live push_to_start tokens,
-- an update or an end the activity's channel if it has one, else its live tokens of kind activity; the
-- child has the parent's payload and options, priority 5 and trap MS015 when demoted, the apns_id
-- push.child_apns_id(parent's, token or channel); the parent ends fanned_out with their ids, and its
-- activity takes the event's state, timestamp and children (:activity_rows, one per routed event). An end
-- the routing gave a newer timestamp (:winner_timestamps, -1: as it is) carries it. A routed event with no
-- target is left running (the worker ends it NoDevice), and what it would have superseded is left alone.
-- Run with push.internal_insert on (mark_internal_insert). Returns (id, children, what): routed events,
-- fenced ones with no target, superseded events.
WITH winners AS MATERIALIZED (
    SELECT j.id, j.topic, j.push_type, j.priority, j.environment, j.credential, j.collapse_id,
           j.expires_at, j.apns_id, j.max_attempts, j.deliver_once, j.traceparent, w.demoted,
           -- An end not newer than what the device shows goes with the timestamp the routing gave it.
           CASE WHEN w.ts < 0 THEN j.payload ELSE jsonb_set(j.payload, '{aps,timestamp}', to_jsonb(w.ts)) END
               AS payload,
           j.payload -> 'aps' ->> 'event' AS event, a.recipient, a.channel_id, a.activity_id,
           a.environment AS channel_environment, a.credential AS channel_credential
      FROM unnest(:winner_ids::bigint[], :winner_attempts::smallint[], :winner_activities::bigint[],
                  :winner_demoted::boolean[], :winner_timestamps::bigint[]) AS w (id, attempt, activity, demoted, ts)
      JOIN push.jobs AS j
        ON j.id = w.id AND j.attempts = w.attempt AND j.locked_by = :worker_id AND j.state = 'running'
      JOIN push.activities AS a ON a.id = w.activity
     ORDER BY j.id
       FOR NO KEY UPDATE OF j
), targets AS (
    SELECT w.id AS parent, t.token, t.channel, t.environment
      FROM winners AS w
     CROSS JOIN LATERAL (
        SELECT d.token, NULL::text AS channel, d.environment
          FROM push.devices AS d
         WHERE d.topic = w.topic AND d.platform = 'apns' AND d.invalidated_at IS NULL
           AND ((w.event = 'start' AND d.kind = 'push_to_start' AND d.recipient = w.recipient)
                OR (w.event <> 'start' AND w.channel_id IS NULL AND d.kind = 'activity'
                    AND d.activity_id = w.activity_id))
        UNION ALL
        -- The channel lives in the activity's environment, under its credential.
        SELECT NULL, w.channel_id, w.channel_environment WHERE w.event <> 'start' AND w.channel_id IS NOT NULL
    ) AS t
), children AS (
    INSERT INTO push.jobs (
        topic, device_token, channel_id, payload, push_type, priority, environment, credential, collapse_id,
        expires_at, apns_id, max_attempts, deliver_once, platform, traceparent, parent_id, trap_ids)
    SELECT w.topic, t.token, t.channel, w.payload, w.push_type, CASE WHEN w.demoted THEN 5 ELSE w.priority END,
           t.environment, CASE WHEN t.channel IS NOT NULL THEN w.channel_credential ELSE w.credential END,
           w.collapse_id, w.expires_at,
           push.child_apns_id(w.apns_id, coalesce(t.token, t.channel)), w.max_attempts, w.deliver_once, 'apns',
           w.traceparent, w.id, CASE WHEN w.demoted THEN ARRAY['MS015'] ELSE '{}'::text[] END
      FROM targets AS t JOIN winners AS w ON w.id = t.parent
     ORDER BY w.id, t.token, t.channel
    ON CONFLICT DO NOTHING
    RETURNING id, parent_id
), kids AS MATERIALIZED (
    SELECT parent_id, array_agg(id ORDER BY id) AS ids FROM children GROUP BY parent_id
), routed AS (
    UPDATE push.jobs AS j
       SET state = 'fanned_out', children = k.ids, reason = NULL,
           first_attempt_at = coalesce(j.first_attempt_at, now()),
           last_attempt_at = now(), locked_by = NULL, locked_until = NULL,
           history = push.append_history(j.history, jsonb_build_object('outcome', 'fanned_out', 'at', now(),
               'children', cardinality(k.ids), 'event', w.event))
      FROM kids AS k JOIN winners AS w ON w.id = k.parent_id
     WHERE j.id = k.parent_id
    RETURNING j.id, j.children
), activities AS (
    UPDATE push.activities AS a
       SET state = i.state, last_timestamp = i.ts, last_event = i.event, last_routed_at = now(),
           -- A start keeps an older update's children not yet sent: they stay in flight for the next rounds.
           children = CASE WHEN i.event = 'start'
                           THEN r.children || ARRAY(SELECT c.id FROM push.jobs AS c
                                                     WHERE c.id = ANY (a.children) AND c.state IN ('pending', 'running'))
                           ELSE r.children END,
           budget_used = i.budget_used,
           budget_hour = CASE WHEN a.budget_hour > now() - interval '1 hour' THEN a.budget_hour ELSE now() END,
           ended_at = CASE WHEN i.state = 'ended' THEN now() ELSE a.ended_at END,
           -- iOS keeps an ended activity on the lock screen up to four hours unless the end says otherwise.
           dismissal_at = CASE WHEN i.state = 'ended'
                               THEN coalesce(to_timestamp(NULLIF(i.dismissal, -1)), now() + interval '4 hours')
                               ELSE a.dismissal_at END
      FROM unnest(:activity_rows::bigint[], :activity_winners::bigint[], :activity_states::text[],
                  :activity_timestamps::bigint[], :activity_events::text[], :activity_budget_used::integer[],
                  :activity_dismissals::bigint[]) AS i (id, winner, state, ts, event, budget_used, dismissal)
      JOIN routed AS r ON r.id = i.winner
     WHERE a.id = i.id
    RETURNING a.id
), parents_superseded AS (
    UPDATE push.jobs AS j
       SET state = 'superseded', superseded_by = NULLIF(i.by, 0), reason = i.reason, attempts = j.attempts - 1,
           locked_by = NULL, locked_until = NULL,
           history = push.append_history(j.history,
               jsonb_strip_nulls(jsonb_build_object('outcome', 'superseded', 'at', now(), 'reason', i.reason,
                                                    'by', NULLIF(i.by, 0))))
      FROM unnest(:superseded_ids::bigint[], :superseded_attempts::smallint[], :superseded_reasons::text[],
                  :superseded_by::bigint[]) AS i (id, attempt, reason, by)
     WHERE j.id = i.id AND j.attempts = i.attempt AND j.locked_by = :worker_id AND j.state = 'running'
       -- Superseded by an event routed now: only if it was (its fence held and it had somewhere to go).
       AND (i.by = 0 OR i.by IN (SELECT id FROM routed))
    RETURNING j.id, j.apns_id, j.platform, j.topic, j.trap_ids, j.reason
), children_superseded AS (
    UPDATE push.jobs AS j
       SET state = 'superseded', superseded_by = i.by, reason = 'StaleTimestamp', locked_by = NULL,
           locked_until = NULL
      FROM unnest(:stale_children::bigint[], :stale_by::bigint[]) AS i (id, by)
     WHERE j.id = i.id AND j.state = 'pending' AND i.by IN (SELECT id FROM routed)
    RETURNING j.id, j.apns_id, j.platform, j.topic, j.trap_ids, j.reason
), deliveries AS (
    -- Webhooks that take `superseded` hear of these in this statement.
    INSERT INTO push.webhook_deliveries (webhook_id, event, job_id, body)
    SELECT h.id, 'superseded', e.id, {{webhook_delivery_body}}
      FROM push.webhooks AS h
      JOIN (SELECT s.id, s.apns_id, s.platform, s.topic, s.trap_ids, s.reason, 'superseded' AS state,
                   NULL::smallint AS status, 'superseded' AS event
              FROM (SELECT * FROM parents_superseded UNION ALL SELECT * FROM children_superseded) AS s) AS e
        ON h.topic IS NULL OR h.topic = e.topic
     WHERE h.disabled_at IS NULL AND 'superseded' = ANY (h.events)
    RETURNING 1
)
SELECT r.id, r.children, 'routed' FROM routed AS r
UNION ALL
-- Fenced, but nowhere to send it: the worker makes it a dead letter (NoDevice).
SELECT w.id, '{}'::bigint[], 'no_target' FROM winners AS w WHERE w.id NOT IN (SELECT id FROM routed)
UNION ALL
SELECT s.id, '{}'::bigint[], 'superseded' FROM parents_superseded AS s
UNION ALL
SELECT 0, '{}'::bigint[], 'activities ' || (SELECT count(*) FROM activities)

-- name: list
-- Activities of :topic (when given), the newest first, at most :limit: each with its state, last event and
-- timestamp, and its budget this hour (the columns of `show`).
SELECT a.id, a.topic, a.activity_id, a.recipient, a.channel_id, a.state, a.last_event, a.last_timestamp,
       a.last_routed_at, a.ended_at, a.dismissal_at, a.created_at,
       CASE WHEN a.budget_hour > now() - interval '1 hour' THEN a.budget_used ELSE 0 END,
       coalesce((SELECT b.per_hour FROM push.activity_budgets AS b WHERE b.topic = a.topic), 12)
  FROM push.activities AS a
 WHERE :topic::text IS NULL OR a.topic = :topic::text
 ORDER BY a.id DESC LIMIT :limit

-- name: show
-- One activity by id (:id), or by :topic and :activity_id.
SELECT a.id, a.topic, a.activity_id, a.recipient, a.channel_id, a.state, a.last_event, a.last_timestamp,
       a.last_routed_at, a.ended_at, a.dismissal_at, a.created_at,
       CASE WHEN a.budget_hour > now() - interval '1 hour' THEN a.budget_used ELSE 0 END,
       coalesce((SELECT b.per_hour FROM push.activity_budgets AS b WHERE b.topic = a.topic), 12)
  FROM push.activities AS a
 WHERE (:id::bigint IS NOT NULL AND a.id = :id::bigint)
    OR (:id::bigint IS NULL AND a.topic = :topic::text AND a.activity_id = :activity_id::text)

-- name: events
-- The events of activity (:topic, :activity_id) in the order they were enqueued: each job with its event,
-- timestamp, state, reason and, once routed, how its children ended.
SELECT j.id, j.payload -> 'aps' ->> 'event', j.payload -> 'aps' ->> 'timestamp', j.state, j.reason,
       j.priority, j.created_at,
       (SELECT count(*) FROM push.jobs AS c WHERE c.id = ANY (j.children) AND c.state = 'delivered'),
       cardinality(j.children)
  FROM push.jobs AS j
 WHERE j.topic = :topic::text AND j.activity_id = :activity_id::text
 ORDER BY j.id

-- name: set_budget
-- Sets :topic's hourly budget of priority-10 updates per activity to :per_hour.
INSERT INTO push.activity_budgets AS b (topic, per_hour) VALUES (:topic::text, :per_hour::integer)
ON CONFLICT (topic) DO UPDATE SET per_hour = excluded.per_hour, updated_at = now()
RETURNING b.per_hour

-- name: enqueue_end
-- An end for activity :id, as `push-worker activities end` sends it: the content-state :content_state, or
-- the last routed event's; timestamp now (newer than every event routed); dismissed :dismiss_after_seconds
-- from now; priority 10. An activity already ended gets none. Returns the job's id.
INSERT INTO push.jobs (topic, activity_id, push_type, priority, payload)
SELECT a.topic, a.activity_id, 'liveactivity', 10,
       jsonb_build_object('aps', jsonb_build_object(
           'event', 'end',
           'timestamp', greatest(extract(epoch FROM now())::bigint, coalesce(a.last_timestamp, 0) + 1),
           'dismissal-date', extract(epoch FROM now())::bigint + :dismiss_after_seconds::bigint,
           'content-state', coalesce(:content_state::jsonb,
               (SELECT j.payload -> 'aps' -> 'content-state' FROM push.jobs AS j
                 WHERE j.topic = a.topic AND j.activity_id = a.activity_id AND j.state = 'fanned_out'
                 ORDER BY j.id DESC LIMIT 1),
               '{}'::jsonb)))
  FROM push.activities AS a
 WHERE a.id = :id::bigint AND a.state <> 'ended'
RETURNING id

-- name: channels_to_delete
-- Up to :limit channels of ended activities whose dismissal passed, leased to the caller for :lease_seconds
-- (another worker skips them meanwhile; a worker that dies leaves them to the next after the lease).
UPDATE push.activities AS a
   SET channel_cleanup_until = now() + make_interval(secs => :lease_seconds)
 WHERE a.id IN (
    SELECT x.id FROM push.activities AS x
     WHERE x.state = 'ended' AND x.channel_id IS NOT NULL AND x.channel_deleted_at IS NULL
       AND x.dismissal_at <= now() AND (x.channel_cleanup_until IS NULL OR x.channel_cleanup_until < now())
       -- Not while the end's requests may still go out (a retry, a pause), nor while another activity that has
       -- not ended sends through the same channel.
       AND NOT EXISTS (SELECT 1 FROM push.jobs AS c WHERE c.id = ANY (x.children) AND c.state IN ('pending', 'running'))
       AND NOT EXISTS (SELECT 1 FROM push.activities AS o WHERE o.channel_id = x.channel_id AND o.state <> 'ended')
     ORDER BY x.dismissal_at LIMIT :limit
       FOR UPDATE SKIP LOCKED)
RETURNING a.id, a.topic, a.channel_id, a.environment, a.credential

-- name: channels_deleted
-- The channels of activities :ids are deleted (or APNs no longer knows them): every activity naming one of them.
UPDATE push.activities SET channel_deleted_at = now(), channel_cleanup_until = NULL
 WHERE channel_id IN (SELECT channel_id FROM push.activities WHERE id = ANY (:ids::bigint[]))
   AND channel_deleted_at IS NULL

-- name: channel_counts
-- Channels of activities not deleted, by environment: what counts against Apple's 10,000 an app.
SELECT environment, count(DISTINCT channel_id) FROM push.activities
 WHERE channel_id IS NOT NULL AND channel_deleted_at IS NULL
 GROUP BY environment ORDER BY environment

-- name: channels_to_create
-- Up to :limit activities that asked for a channel and have none yet (not ended), leased to the caller for
-- :lease_seconds: their topic, environment, credential and storage policy.
UPDATE push.activities AS a
   SET channel_cleanup_until = now() + make_interval(secs => :lease_seconds)
 WHERE a.id IN (
    SELECT x.id FROM push.activities AS x
     WHERE x.wants_channel AND x.channel_id IS NULL AND x.state <> 'ended'
       AND (x.channel_cleanup_until IS NULL OR x.channel_cleanup_until < now())
     ORDER BY x.id LIMIT :limit
       FOR UPDATE SKIP LOCKED)
RETURNING a.id, a.topic, a.environment, a.credential, a.channel_storage

-- name: channel_created
-- Activity :id's channel is :channel_id (created by the caller); its events waiting for it go now. No row:
-- another worker recorded one first (the caller deletes its own).
UPDATE push.activities SET channel_id = :channel_id::text, channel_cleanup_until = NULL
 WHERE id = :id::bigint AND channel_id IS NULL
RETURNING id

-- name: channel_refused
-- APNs refused to create activity :id's channel (:error): it asks for none any more, and its updates and end
-- go by its tokens (or end NoDevice, naming the fix).
UPDATE push.activities SET wants_channel = false, channel_cleanup_until = NULL
 WHERE id = :id::bigint AND channel_id IS NULL AND :error::text IS NOT NULL
