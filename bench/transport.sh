#!/usr/bin/env bash
# APNs transport throughput: push-worker's APNsClient against the simulator's fast mode with 1 and 4
# connections, next to h2load (Debian's nghttp2-client) against the same simulator. Prints req/s and ratios.
#   bash bench/transport.sh [--requests 40000] [--concurrency 256]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v h2load >/dev/null || { echo "h2load missing: apt-get install -y nghttp2-client" >&2; exit 1; }
swift build -c release --product push-bench
"$(swift build -c release --show-bin-path)/push-bench" transport "$@"
