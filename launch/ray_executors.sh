#!/usr/bin/env bash
# The executor fleet on a Ray cluster. On the head node:   launch/ray_executors.sh head
# On each executor machine:                                 HEAD=10.0.0.5:6379 launch/ray_executors.sh worker
# Each executor machine needs this repo, `make sandbox-env` (bwrap) or the sandbox image (docker),
# and the prepared task folders at the same paths as the learner (shared storage).
# Then run the learner with --config.executor.fleet=ray --config.executor.ray_address=<head>:6379
set -euo pipefail
cd "$(dirname "$0")/.."
make -s install apt sandbox-env
case "${1:-}" in
  head)   exec .venv/bin/ray start --head --port="${PORT:-6379}" --num-cpus="${CPUS:-$(nproc)}" --block ;;
  worker) exec .venv/bin/ray start --address="${HEAD:?set HEAD=host:port}" --num-cpus="${CPUS:-$(nproc)}" --block ;;
  *) echo "usage: $0 head|worker"; exit 2 ;;
esac
