#!/usr/bin/env bash
# Runs a command in a network namespace of its own whose only interface is lo: whatever it starts (Ray, vLLM
# servers, sandboxes, the learner) can reach loopback and nothing else. Ray, which rewrites 127.0.0.1 to the
# interface address on a normal host, finds no interface here and stays on 127.0.0.1. Needs root (or user
# namespaces) and iproute2. Usage: tests/loopback_only.sh COMMAND [ARG...]
set -euo pipefail
command -v unshare >/dev/null && command -v ip >/dev/null || {
  echo "loopback_only.sh: needs unshare (util-linux) and ip (iproute2): run 'make apt'" >&2; exit 2; }
exec unshare --net -- bash -c 'ip link set lo up && MLE_JAX_TEST_NETNS=1 exec "$@"' loopback_only "$@"
