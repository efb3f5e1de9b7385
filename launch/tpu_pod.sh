#!/usr/bin/env bash
# A multi-host TPU pod slice: run this same command on every host (e.g. through
# `gcloud compute tpus tpu-vm ssh $TPU --worker=all --command="cd mle_jax && launch/tpu_pod.sh"`).
# jax.distributed.initialize() finds the coordinator from the TPU metadata; every host runs the
# learner over the global mesh (data x fsdp x tensor from the config). The sampler is a vllm-tpu
# server on host 0 (or any URL given); executors are a Ray cluster (launch/ray_executors.sh).
#
#   MODEL=gs-fuse/Qwen2.5-3B-Instruct CONFIG=configs/pizza.py VLLM_URL=http://host0:8100 \
#   INSTR_URL=http://host0:8101 RAY_ADDRESS=host0:6379 WORKDIR=/mnt/shared/runs/pizza launch/tpu_pod.sh
#
# Several sampler servers (e.g. one vllm-tpu server per host, each group of n samples to the least-loaded, every
# weight sync to all): VLLM_URLS=http://host0:8100,http://host1:8100 instead of VLLM_URL (sampler.vllm_urls). The
# weights reach them as files on shared storage (sampler.sync_source hf or orbax; shm is for one host).
#
# More than one slice (a Cloud TPU multislice job, which sets MEGASCALE_NUM_SLICES on every host; or NUM_SLICES=N):
# the mesh's data axis spans the slices over the data-centre network (mesh.dcn_data = N, a hybrid mesh), fsdp
# stays inside each slice, as `python -m mle_jax.plan --num_slices N` plans it.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MODEL:?}" "${VLLM_URL:=${VLLM_URLS:?set VLLM_URL (or VLLM_URLS=url1,url2)}}" "${INSTR_URL:?}" "${RAY_ADDRESS:?}" "${WORKDIR:?shared storage (NFS/GCS fuse) for checkpoints}"
CONFIG=${CONFIG:-configs/pizza.py}
NUM_SLICES=${NUM_SLICES:-${MEGASCALE_NUM_SLICES:-1}}
SERVERS_FLAG=(--config.sampler.vllm_url="$VLLM_URL")
if [ -n "${VLLM_URLS:-}" ]; then SERVERS_FLAG=(--config.sampler.vllm_urls="'$VLLM_URLS'"); fi
export MLE_JAX_DISTRIBUTED=auto  # sharding.maybe_initialize_distributed(): jax.distributed.initialize() finds the pod
.venv/bin/python -m mle_jax.launch --config="$CONFIG" \
  --config.model.path="$MODEL" \
  --config.sampler.backend=vllm "${SERVERS_FLAG[@]}" \
  --config.instrument.vllm_url="$INSTR_URL" \
  --config.executor.fleet=ray --config.executor.ray_address="$RAY_ADDRESS" \
  --config.mesh.data=1 --config.mesh.fsdp=-1 --config.mesh.tensor=1 --config.mesh.dcn_data="$NUM_SLICES" \
  --config.workdir="$WORKDIR" "$@"
