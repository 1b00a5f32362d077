#!/usr/bin/env bash
# Two rows of issue 22's table, re-run with a real push-worker binary against Postgres (DATABASE_URL) and the
# built-in simulator: (1) a producer re-enqueues the queued jobs with ON CONFLICT (apns_id) DO NOTHING and
# holds its transaction open 20 s while two workers drain 3,000 jobs, a tenth of which are dead letters (a
# topic with a push-type suffix, refused before sending): where the jobs are after 12 s;
# (2) a limit of one a minute (burst 1): how many of 3 jobs are sent in 18 s.
#   DATABASE_URL=postgres://… bash bench/fleet-rows.sh path/to/push-worker
set -euo pipefail
worker="$1"
: "${DATABASE_URL:?set DATABASE_URL to a scratch database}"
psql() { command psql -X -q -t -A "$DATABASE_URL" "$@"; }
reset() {
  "$worker" migrate >/dev/null
  psql -c "TRUNCATE push.jobs, push.dead_jobs, push.rate_limits, push.pauses, push.workers"
  psql -c "DO \$\$ BEGIN IF to_regclass('push.apns_ids') IS NOT NULL THEN TRUNCATE push.apns_ids; END IF; END \$\$"
}
start() { "$worker" run --simulator --worker-id "$1" --no-metrics --log-level error >"/tmp/fleet-rows-$1.log" 2>&1 & echo $!; }

echo "== row 1: a producer holds an open re-enqueue of the in-flight jobs for 20 s"
reset
psql -c "INSERT INTO push.jobs (topic, device_token, payload) SELECT CASE WHEN g % 10 = 0 THEN 'com.example.app.voip' ELSE 'com.example.app' END, lpad(to_hex(g), 64, '0'), '{\"aps\":{\"alert\":\"hi\"}}' FROM generate_series(1, 3000) g"
( command psql -X -q "$DATABASE_URL" <<'SQL'
BEGIN;
INSERT INTO push.jobs (topic, device_token, payload, apns_id)
SELECT topic, device_token, payload, apns_id FROM push.jobs WHERE state IN ('running', 'pending') ON CONFLICT (apns_id) DO NOTHING;
SELECT pg_sleep(20);
COMMIT;
SQL
) >/dev/null 2>&1 &
producer=$!
sleep 0.5
a=$(start a); b=$(start b)
sleep 12
echo "after 12 s, with the producer's transaction open: $(psql -c "SELECT string_agg(state || ' ' || n, ', ') FROM (SELECT state, count(*) n FROM push.jobs GROUP BY state ORDER BY state) s"), dead $(psql -c "SELECT count(*) FROM push.dead_jobs")"
wait $producer
sleep 3
echo "3 s after it committed: $(psql -c "SELECT string_agg(state || ' ' || n, ', ') FROM (SELECT state, count(*) n FROM push.jobs GROUP BY state ORDER BY state) s"), dead $(psql -c "SELECT count(*) FROM push.dead_jobs")"
kill $a $b; wait $a $b 2>/dev/null || true

echo "== row 2: one a minute, burst 1"
reset
"$worker" limits set --per-second 0.0166667 --burst 1 >/dev/null
psql -c "INSERT INTO push.jobs (topic, device_token, payload) SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{\"aps\":{\"alert\":\"hi\"}}' FROM generate_series(1, 3) g"
a=$(start a)
sleep 18
echo "after 18 s: $(psql -c "SELECT count(*) FROM push.jobs WHERE state = 'delivered'") of 3 delivered; push-worker limits says: $("$worker" limits | tail -1)"
kill $a; wait $a 2>/dev/null || true
