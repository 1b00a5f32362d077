-- The CTE pending_credentials: the distinct credentials with pending jobs, by a skip scan of
-- jobs_claim_by_topic_idx (one probe per credential, not a scan of the backlog); a last row of NULL ends it.
pending_credentials AS (
    (SELECT credential FROM push.jobs WHERE state = 'pending' ORDER BY credential LIMIT 1)
    UNION ALL
    SELECT (SELECT j.credential FROM push.jobs AS j
             WHERE j.state = 'pending' AND j.credential > p.credential ORDER BY j.credential LIMIT 1)
      FROM pending_credentials AS p WHERE p.credential IS NOT NULL
)
