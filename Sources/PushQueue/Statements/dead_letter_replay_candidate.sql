-- What a replay decides for each dead letter `j` it selects, as columns: conflicted, broken, renumber (and the
-- columns the ranking partitions by).
-- conflicted: its id, or (keeping its apns_id) its apns_id, is already in push.jobs: skipped, never dropped.
-- broken: a rule the schema checks at INSERT that it breaks (it died before the schema checked it), or a Live
-- Activity event's request: it is reported with the rule, and the others move.
-- renumber: a keyed dead letter whose key has a job above its id that carries an older state (a superseded
-- job revived after this one died, or replayed before it) and none that carries a newer one goes out under a
-- new id above them: latest-wins orders by id, and this is the newest state that can still arrive. The state
-- a job carries is as old as the oldest id in its history (`previous_id` of a revive or of a renumbered
-- replay), the dead letter's own included (it may have been renumbered before).
j.id, j.apns_id, j.reason, j.expires_at, j.topic, j.environment, j.coalesce_key,
EXISTS (SELECT 1 FROM push.jobs AS x WHERE x.id = j.id OR (NOT :new_apns_id AND x.apns_id = j.apns_id)) AS conflicted,
-- A Live Activity event's request (a routed event's child): replayed, it would reach the device out of the
-- activity's order (after newer events, or after the end); enqueue a new event instead.
CASE WHEN j.parent_id IS NOT NULL AND j.push_type = 'liveactivity'
     THEN 'live_activity_requests_are_not_replayed_enqueue_a_new_event'
     ELSE push.broken_rule(j.platform, j.environment, j.topic, j.device_token, j.channel_id, j.payload, j.push_type,
                           j.priority, j.collapse_id, j.credential, now(),
                           coalesce(now() + make_interval(secs => :expires_in_seconds::float8), j.expires_at))
END AS broken,
(j.coalesce_key IS NOT NULL AND EXISTS (
    SELECT 1 FROM push.jobs AS n
     WHERE n.coalesce_key = j.coalesce_key AND n.topic = j.topic AND n.environment = j.environment
       AND n.id > j.id AND n.state IN ('pending', 'running', 'delivered'))
 AND NOT EXISTS (
    SELECT 1 FROM push.jobs AS n
     WHERE n.coalesce_key = j.coalesce_key AND n.topic = j.topic AND n.environment = j.environment
       AND n.id > j.id AND n.state IN ('pending', 'running', 'delivered')
       AND coalesce((SELECT min((e->>'previous_id')::bigint) FROM jsonb_array_elements(n.history) AS e
                      WHERE e->>'outcome' IN ('revived', 'replayed') AND e ? 'previous_id'), n.id)
           > coalesce((SELECT min((e->>'previous_id')::bigint) FROM jsonb_array_elements(j.history) AS e
                        WHERE e->>'outcome' IN ('revived', 'replayed') AND e ? 'previous_id'), j.id))) AS renumber
