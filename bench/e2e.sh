#!/usr/bin/env bash
# End to end: the real push-worker binary (release) against a fresh fsync-on Postgres and nghttpd as the APNs
# stand-in (--sink simulator: the project's simulator in fast mode). Prints drain throughput (jobs/s, outcomes
# written), CPU per job of the worker, Postgres and the stand-in, enqueue-to-request latency p50/p99 at a
# steady 1,000 single-row INSERTs/s, worker RSS idle and under load, and, in the same run, the SQL ceiling
# (pgbench doing the same claim+record SQL), the transport ceiling (h2load against the same stand-in), and the
# peer: PGQueuer 1.6 + aioapns 4.0 in two processes draining the same jobs (bench/peer/pgqueuer_aioapns.py).
#   bash bench/e2e.sh [--jobs 50000] [--rate 1000] [--seconds 10]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v pgbench >/dev/null || { echo "pgbench missing: apt-get install -y postgresql-client" >&2; exit 1; }
command -v h2load >/dev/null || { echo "h2load missing: apt-get install -y nghttp2-client" >&2; exit 1; }
command -v nghttpd >/dev/null || { echo "nghttpd missing (the APNs stand-in): apt-get install -y nghttp2-server" >&2; exit 1; }
swift build -c release --product push-worker
swift build -c release --product push-bench
bin="$(swift build -c release --show-bin-path)"
# The peer (PGQueuer 1.6 + aioapns 4.0, bench/peer/pgqueuer_aioapns.py) in a venv under .build/, from PyPI once.
# Without PyPI the run goes on without the comparison. PEER=0 skips it.
peer=()
if [ "${PEER:-1}" != 0 ]; then
  venv=.build/peer-venv
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import pgqueuer, aioapns, asyncpg' 2>/dev/null; then
    python3 -m venv "$venv" && "$venv/bin/pip" install -q 'pgqueuer[asyncpg]==1.6.0' 'aioapns==4.0' \
      || echo "the peer's packages did not install (PyPI unreachable?): measuring without the peer" >&2
  fi
  "$venv/bin/python" -c 'import pgqueuer, aioapns, asyncpg' 2>/dev/null && peer=(--peer-python "$venv/bin/python")
fi
"$bin/push-bench" e2e --worker "$bin/push-worker" --sql-directory bench "${peer[@]}" "$@"
