-- The earliest run_at of any pending job, as a scalar subquery: the (credential, environment, topic) ranges of
-- jobs_claim_by_topic_idx found by a skip scan (one probe each), then one probe per send priority in each.
-- Never a scan of the backlog.
(WITH RECURSIVE pending_ranges AS (
    (SELECT credential, environment, topic FROM push.jobs WHERE state = 'pending'
      ORDER BY credential, environment, topic LIMIT 1)
    UNION ALL
    SELECT n.credential, n.environment, n.topic FROM pending_ranges AS p
     CROSS JOIN LATERAL (
        SELECT j.credential, j.environment, j.topic FROM push.jobs AS j
         WHERE j.state = 'pending' AND (j.credential, j.environment, j.topic) > (p.credential, p.environment, p.topic)
         ORDER BY j.credential, j.environment, j.topic LIMIT 1) AS n
)
SELECT min(f.run_at) FROM pending_ranges AS r
 CROSS JOIN (VALUES (10::smallint), (5::smallint), (1::smallint)) AS p(priority)
 CROSS JOIN LATERAL (
    SELECT j.run_at FROM push.jobs AS j
     WHERE j.state = 'pending' AND j.credential = r.credential AND j.environment = r.environment
       AND j.topic = r.topic AND j.send_priority = p.priority
     ORDER BY j.run_at LIMIT 1) AS f)
