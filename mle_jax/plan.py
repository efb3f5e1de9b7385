"""python -m mle_jax.plan --config=configs/pizza.py --devices=8 --device_memory_gib=40 [--out plan.json]

Compiles the run's PPO update and the sampler's decode step for hardware that need not be here and prints
per-device memory, FLOPs and the projected step time (`mle_jax.planning` says how each number is made).

    --target=cpu (default)                 N fake CPU devices
    --target=a100-40|a100-80|h100-80|h200  XLA's deviceless GPU compile (`make aot-env`; run with .aot-venv/bin/python)
    --topology=v5p:2x2x2                   a TPU slice through libtpu (`make aot-env`; .aot-venv/bin/python)
    --compare_scan                         also compile the other layer stack (scanned / unrolled)
    --config.a.b=v                         overrides, as in mle_jax.launch

A layout that cannot work (a mesh that does not divide the devices, heads that do not divide the tensor axis,
micro-batches that do not divide over the batch axes) ends in one line naming the numbers that clash.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from absl import app, flags, logging

from mle_jax.launch import CONFIG, fail, parse_flags
from mle_jax.planning import GPU_TARGETS, PlanError, format_plan, make_plan, make_target
from mle_jax.settings import ConfigError, from_config

_DEVICES = flags.DEFINE_integer("devices", 0, "devices to plan for (0: all of --topology's chips; else required)")
_MEMORY = flags.DEFINE_float("device_memory_gib", 0.0, "memory of one device in GiB (0: the target's own)")
_TARGET = flags.DEFINE_enum("target", "cpu", ["cpu", *GPU_TARGETS], "what to compile for (see the module doc)")
_TOPOLOGY = flags.DEFINE_string("topology", "", "a TPU topology such as v5p:2x2x2 (compiles with libtpu)")
_OUT = flags.DEFINE_string("out", "", "write the plan as JSON here")
_MFU = flags.DEFINE_float("mfu", 0.4, "model FLOPs utilisation assumed for the projected step time")
_PEAK = flags.DEFINE_float("peak_tflops", None, "dense bf16 peak per device (default: the target's)")
_COMPARE_SCAN = flags.DEFINE_bool("compare_scan", False, "also compile the other layer stack (scanned/unrolled)")
_DECODE = flags.DEFINE_bool("decode", True, "also compile the sampler's decode step")


def main(argv: Sequence[str]) -> None:
    del argv
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    cfg = CONFIG.value
    if cfg is None:
        fail("--config is required, e.g. --config=configs/pizza.py")
    try:
        settings = from_config(cfg)
        target = make_target(_TARGET.value, _TOPOLOGY.value, _DEVICES.value)
        memory = _MEMORY.value or target.memory_gib
        if memory <= 0:
            raise PlanError(f"--device_memory_gib is required for --target={target.name}")
        plan = make_plan(settings, target, memory, _MFU.value, _PEAK.value, _COMPARE_SCAN.value, _DECODE.value)
    except (ConfigError, PlanError, FileNotFoundError) as e:
        fail(str(e))
        return
    print(format_plan(plan))
    if _OUT.value:
        Path(_OUT.value).write_text(json.dumps(plan, indent=2) + "\n")
        print(f"wrote {_OUT.value}")
    sys.stdout.flush()


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # libtpu's and the CUDA plugin's start-up chatter
    app.run(main, flags_parser=parse_flags)
