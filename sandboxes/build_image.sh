#!/usr/bin/env bash
# Build (or find cached) the docker backend's image. Needs root, debootstrap and a Docker-compatible
# socket: DOCKER_HOST, or a Podman service (podman --runtime runc system service --time=0 unix:///tmp/x.sock).
# The image is tagged with a hash of sandboxes/Dockerfile and rebuilt only when that changes.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m mle_jax.executor build-image "$@"
