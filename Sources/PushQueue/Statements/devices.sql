-- push.devices, the device registry, as operators read it (JobQueue+Devices.swift). Producers write it with
-- their own upsert (docs/operations.md); the worker marks a token invalid through push.invalid_tokens'
-- trigger (migration 0017), and the next upsert of the token clears the mark.
-- Each statement starts at its `-- name:` line; the comment lines right after it describe it.

-- name: list
-- Devices of :recipient and :topic (each when given), the newest registration first, at most :limit.
SELECT id, recipient, platform, topic, token, kind, activity_id, environment, registered_at, invalidated_at,
       invalidated_reason
  FROM push.devices
 WHERE (:recipient::text IS NULL OR recipient = :recipient::text)
   AND (:topic::text IS NULL OR topic = :topic::text)
 ORDER BY registered_at DESC, id DESC LIMIT :limit

-- name: counts
-- Devices of :topic (when given): all, live, and recipients with at least one live device.
SELECT count(*), count(*) FILTER (WHERE invalidated_at IS NULL),
       count(DISTINCT recipient) FILTER (WHERE invalidated_at IS NULL)
  FROM push.devices
 WHERE :topic::text IS NULL OR topic = :topic::text
