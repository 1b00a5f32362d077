#!/usr/bin/env bash
# Checks every deploy/ artifact with a real tool, and against the real push-worker binary:
#   systemd      systemd-analyze verify (unit installed in a scratch root next to the binary it names),
#                systemd-analyze security --offline (exposure ≤ 2.5), ExecStart parsed by the CLI
#   docker       deploy/check_deploy.py docker: Dockerfile paths, build command, entrypoint and
#                healthcheck against the real build and CLI; compose.yaml against the Compose spec
#   kubernetes   kubernetes-validate --strict (bundled OpenAPI schemas, offline) + cross-checks
#   prometheus   promtool check rules, promtool test rules, metric names exist in the worker
# Docker itself cannot run on the build machines: nothing here needs a Docker engine.
# Usage: bash deploy/check.sh [--release-build]
#   Builds the debug push-worker first if needed. With --release-build (always under CI=true) it also
#   runs the Dockerfile's own `swift build` command here and checks the shared libraries of the
#   static-stdlib binary it makes against the runtime image (about 6 minutes on 2 cores, cold).
# Tools: systemd (systemd-analyze), prometheus (promtool), python3 with PyYAML, kubernetes-validate
# and compose-spec; .ci/run installs them.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${PUSH_WORKER_BIN:-}" ]]; then
    swift build --product push-worker >/dev/null
    PUSH_WORKER_BIN="$(swift build --show-bin-path)/push-worker"
fi
export PUSH_WORKER_BIN
for tool in systemd-analyze promtool python3 kubernetes-validate; do
    command -v "$tool" >/dev/null || { echo "deploy/check.sh: $tool is not installed (.ci/run installs it)" >&2; exit 2; }
done

echo "== systemd: systemd-analyze verify deploy/systemd/push-worker.service"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
install -D -m 0755 "$PUSH_WORKER_BIN" "$root/usr/local/bin/push-worker"
mkdir -p "$root/usr/lib/systemd" "$root/etc/systemd/system" "$root/etc/push-worker"
cp -a /lib/systemd/system "$root/usr/lib/systemd/"
install -m 0644 deploy/systemd/push-worker.service "$root/etc/systemd/system/push-worker.service"
install -m 0640 deploy/systemd/push-worker.env "$root/etc/push-worker/push-worker.env"
# verify exits 0 on warnings such as an unknown key: any output is a failure.
output="$(systemd-analyze verify --root="$root" push-worker.service 2>&1 || true)"
if [[ -n "$output" ]]; then
    echo "$output" >&2
    echo "systemd-analyze verify: the unit has problems (above)" >&2
    exit 1
fi
echo "== systemd: systemd-analyze security --offline (threshold 2.5)"
systemd-analyze security --offline=yes --root="$root" --threshold=25 --no-pager push-worker.service | tail -1

echo "== docker: the Dockerfile's dependency layer resolves from Package.swift alone"
scratch="$(mktemp -d)"
trap 'rm -rf "$root" "$scratch"' EXIT
cp Package.swift "$scratch/"
(cd "$scratch" && swift package resolve >/dev/null 2>&1) || { echo "swift package resolve failed with Package.swift alone (the Dockerfile's first layer)" >&2; exit 1; }

if [[ "${CI:-}" == true || "${1:-}" == --release-build ]]; then
    # The build command exactly as the Dockerfile writes it, run in this checkout.
    build="$(grep -o 'swift build -c release[^&]*--product [a-z-]*' deploy/docker/Dockerfile | head -1)"
    show="$(grep -o 'swift build [^)]*--show-bin-path' deploy/docker/Dockerfile | head -1)"
    echo "== docker: $build"
    $build 2>&1 | tail -1
    PUSH_WORKER_RELEASE_BIN="$($show)/push-worker"
    export PUSH_WORKER_RELEASE_BIN
    "$PUSH_WORKER_RELEASE_BIN" check-arguments run --log-format json
fi

python3 deploy/check_deploy.py systemd docker kubernetes prometheus

echo "== kubernetes: kubernetes-validate --strict (1.30 and 1.37 schemas)"
for version in 1.30.0 1.37.0; do
    kubernetes-validate --strict --quiet -k "$version" deploy/kubernetes/*.yaml
done

echo "== prometheus: promtool check rules / test rules"
promtool check rules deploy/prometheus/alerts.yaml
promtool test rules deploy/prometheus/alerts.test.yaml

echo "deploy/check.sh: all deploy artifacts check out"
