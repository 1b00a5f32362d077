-- How many jobs a claim could take now under a push.rate_limits row: the claim's own function with the default
-- lease's look-ahead (30 s), read only.
greatest(push.rate_available(per_second::float8, burst::float8,
                             greatest(extract(epoch FROM next_send_at - clock_timestamp()), 0), 30), 0)::bigint
