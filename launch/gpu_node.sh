#!/usr/bin/env bash
# One GPU node: two vLLM servers (the policy, synced every step; the frozen initial model that
# instruments code), the learner on the remaining memory, executors on this node's cores.
#
#   MODEL=/models/Qwen2.5-3B-Instruct CONFIG=configs/pizza.py launch/gpu_node.sh [--config.x=y ...]
#
# Env: MODEL (HF folder, required), CONFIG (default configs/pizza.py), POLICY_PORT/INSTR_PORT,
# GPU_MEM (vLLM memory fraction per server, default 0.2 as in the paper), WORKDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MODEL:?set MODEL to a local Qwen2.5 HF folder}"
CONFIG=${CONFIG:-configs/pizza.py}
POLICY_PORT=${POLICY_PORT:-8100}
INSTR_PORT=${INSTR_PORT:-8101}
GPU_MEM=${GPU_MEM:-0.2}
WORKDIR=${WORKDIR:-runs/$(basename "$CONFIG" .py)-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$WORKDIR"

PORT=$POLICY_PORT GPU_MEM=$GPU_MEM launch/vllm_server.sh "$MODEL" >"$WORKDIR/vllm_policy.log" 2>&1 &
POLICY_PID=$!
PORT=$INSTR_PORT GPU_MEM=$GPU_MEM launch/vllm_server.sh "$MODEL" >"$WORKDIR/vllm_instrument.log" 2>&1 &
INSTR_PID=$!
trap 'kill $POLICY_PID $INSTR_PID 2>/dev/null || true' EXIT

for port in $POLICY_PORT $INSTR_PORT; do
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "vLLM on :$port did not start; see $WORKDIR"; exit 1; }
done

# The learner leaves 2 x GPU_MEM of the GPU to the servers.
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.95 - 2 * $GPU_MEM, 2))")
.venv/bin/python -m mle_jax.launch --config="$CONFIG" \
  --config.model.path="$MODEL" \
  --config.sampler.backend=vllm \
  --config.sampler.vllm_url="http://127.0.0.1:$POLICY_PORT" \
  --config.instrument.vllm_url="http://127.0.0.1:$INSTR_PORT" \
  --config.workdir="$WORKDIR" "$@"
