"""The docker backend's image: built once from sandboxes/Dockerfile and cached by a hash of it.

Docker Hub is not reachable here, so the base is made locally: `debootstrap` a minimal Debian bookworm
(python3.11, libgomp1) from the Debian mirror and import it as BASE_TAG. With Docker Hub, pass
base="debian:bookworm-slim" instead. The packages come from the host's sandbox venv, bind-mounted at
run time (see the Dockerfile), so nothing is pip-installed into the image.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from mle_jax.executor.runtime import REPO_ROOT

log = logging.getLogger(__name__)

SANDBOXES_DIR = REPO_ROOT / "sandboxes"
BASE_TAG = "localhost/mle-jax-sandbox-base:bookworm"
HASH_LABEL = "org.mle_jax.dockerfile"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3.11", "libgomp1")
_LOCK = Path(tempfile.gettempdir()) / "mle_jax_sandbox_image.lock"
# Set by tests/loopback_only.sh: a namespace whose only interface is lo, where debootstrap cannot reach the mirror.
NO_NETWORK_ENV = "MLE_JAX_TEST_NETNS"
BUILD_COMMAND = "make sandbox-image"


class ImageMissing(RuntimeError):
    """The sandbox image is absent or older than sandboxes/Dockerfile, and this process may not build it."""


def dockerfile_hash() -> str:
    return hashlib.sha256((SANDBOXES_DIR / "Dockerfile").read_bytes()).hexdigest()[:16]


def _has_image(client, tag: str):
    import docker  # optional dependency

    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None


def build_base(client, tag: str = BASE_TAG, mirror: str = DEBIAN_MIRROR) -> None:
    """debootstrap bookworm (minbase + BASE_PACKAGES) and import it as `tag`. Needs root."""
    debootstrap = shutil.which("debootstrap", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if debootstrap is None:
        raise FileNotFoundError("debootstrap not found: apt-get install debootstrap (or `make apt`)")
    if os.geteuid() != 0:
        raise PermissionError("building the base image with debootstrap needs root")
    with tempfile.TemporaryDirectory(prefix="mle_jax_rootfs_") as tmp:
        rootfs, tar_path = Path(tmp) / "rootfs", Path(tmp) / "rootfs.tar"
        log.info("debootstrap bookworm into %s (about 1-2 minutes)", rootfs)
        subprocess.run(
            [debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", "bookworm", str(rootfs), mirror],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        with tarfile.open(tar_path, "w") as tar:
            tar.add(rootfs, arcname=".")
        repository, _, version = tag.rpartition(":")
        client.api.import_image_from_file(str(tar_path), repository=repository, tag=version)
    if _has_image(client, tag) is None:  # Podman's compat import ignores the tag
        imported = _has_image(client, f"{repository}:latest")
        if imported is not None:
            imported.tag(repository, version)
    if _has_image(client, tag) is None:
        raise RuntimeError(f"importing the base rootfs as {tag} failed")


def may_build() -> bool:
    """False inside the test suite's no-network namespace: images are built before it (`make test` needs them)."""
    return not os.environ.get(NO_NETWORK_ENV)


def ensure_image(client, tag: str, base: str | None = None, rebuild: bool = False, build: bool | None = None) -> str:
    """The id of `tag` built from the current sandboxes/Dockerfile, building it (and the base) if needed.

    build: whether a missing or stale image may be built here (default: outside the tests' no-network namespace);
    when not, a missing or stale image raises ImageMissing in one line naming `make sandbox-image`.
    """
    want = dockerfile_hash()
    if build is None:
        build = may_build()
    with open(_LOCK, "w") as lock:  # one build at a time on this machine
        fcntl.flock(lock, fcntl.LOCK_EX)
        image = _has_image(client, tag)
        if image is not None and not rebuild and image.labels.get(HASH_LABEL) == want:
            log.info("%s is up to date with sandboxes/Dockerfile (%s): nothing to build", tag, want)
            return image.id
        if not build:
            state = "missing" if image is None else "older than sandboxes/Dockerfile"
            raise ImageMissing(f"the sandbox image {tag} is {state}: run `{BUILD_COMMAND}` (it needs the network)")
        if base is None:
            base = BASE_TAG
            if _has_image(client, base) is None:
                build_base(client, base)
        log.info("building %s from %s (base %s)", tag, SANDBOXES_DIR / "Dockerfile", base)
        image, _ = client.images.build(
            path=str(SANDBOXES_DIR),
            dockerfile="Dockerfile",
            tag=tag,
            buildargs={"BASE": base},
            labels={HASH_LABEL: want},
            network_mode="none",
            rm=True,
            forcerm=True,
        )
        return image.id
