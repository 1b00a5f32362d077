#!/usr/bin/env bash
# Claim+record throughput of the queue API alone (one worker, batch sizes 1, 100, 500) next to pgbench
# running the same SQL against the same fresh, fsync-on Postgres cluster. Prints jobs/s and the ratio.
#   bash bench/queue.sh            # embedded cluster in a temporary directory
#   DATABASE_URL=… bash bench/queue.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v pgbench >/dev/null || { echo "pgbench missing: apt-get install -y postgresql-client" >&2; exit 1; }
swift build -c release --product push-bench
"$(swift build -c release --show-bin-path)/push-bench" queue --sql-directory bench "$@"
