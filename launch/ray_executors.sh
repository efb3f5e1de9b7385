#!/usr/bin/env bash
# The executor fleet on a Ray cluster. On the head node:   launch/ray_executors.sh head
# On each executor machine:                                 HEAD=10.0.0.5:6379 launch/ray_executors.sh worker
# Each machine needs this repo with `make install sandbox-env` (bwrap) or the sandbox image (docker), and the
# prepared task folders at the same paths as the learner (shared storage).
# Then run the learner with --config.executor.fleet=ray --config.executor.ray_address=<head>:6379
# Env: PORT (head's, default 6379), CPUS (default: all cores), NODE_IP (this node's address, default Ray's
# choice), RAY_TEMP_DIR (head: Ray's session folder, default /tmp/ray).
# A cluster on this one machine that keeps all its traffic on loopback: NODE_IP=127.0.0.2 for head and workers,
# HEAD=127.0.0.2:6379, and the learner's ray_address=127.0.0.2:6379. Not 127.0.0.1 or localhost: Ray replaces
# those with this machine's interface address, and its GCS, raylets and object managers then talk over it
# (any other 127.x.y.z Ray keeps, and Linux routes all of 127.0.0.0/8 over loopback).
# Runs in the foreground (--block); SIGTERM stops the node's Ray processes.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/ray ]; then
  echo "ray_executors.sh: .venv/bin/ray not found: run 'make install sandbox-env' first" >&2
  exit 2
fi
ARGS=(--num-cpus="${CPUS:-$(nproc)}" --block --disable-usage-stats)
[ -n "${NODE_IP:-}" ] && ARGS+=(--node-ip-address="$NODE_IP")
case "${NODE_IP:-}" in
  127.0.0.1|localhost|::1) echo "ray_executors.sh: Ray replaces NODE_IP=$NODE_IP with this machine's interface" \
    "address; NODE_IP=127.0.0.2 keeps a one-machine cluster on loopback" >&2 ;;
esac
case "${1:-}" in
  head)
    [ -n "${RAY_TEMP_DIR:-}" ] && ARGS+=(--temp-dir="$RAY_TEMP_DIR")
    exec .venv/bin/ray start --head --port="${PORT:-6379}" "${ARGS[@]}" ;;
  worker) exec .venv/bin/ray start --address="${HEAD:?set HEAD=host:port}" "${ARGS[@]}" ;;
  *) echo "usage: $0 head|worker" >&2; exit 2 ;;
esac
