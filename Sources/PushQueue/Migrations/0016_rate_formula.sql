-- Schema 16: the rate formula is one SQL function, read by the claim and by `push-worker limits`.
--
-- How many jobs a limit lets a claim take now: its send times one interval (1 / per_second) apart, from its
-- schedule's tail `delay` seconds ahead of now, must fall within the look-ahead: `burst` intervals, at most
-- half the lease but never less than one interval, so any rate sends, however slow. In float8
-- `(1 / r) * r` can come out just under 1 (for 82 of the integer rates 1-1000): a tolerance keeps such a limit
-- from never sending. A plain SQL expression: the planner inlines it, so the claim's plan does not change.
CREATE OR REPLACE FUNCTION push.rate_available(
    per_second double precision,
    burst double precision,
    delay double precision,
    half_lease double precision
) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT floor((least(burst / per_second, greatest(half_lease, 1 / per_second)) - delay) * per_second + 1e-9) $$;

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (16, '0016_rate_formula.sql') ON CONFLICT (version) DO NOTHING;
