"""python -m mle_jax.plan --config=configs/pizza.py --devices=8 --device_memory_gib=40 [--out plan.json]

Compiles the run's PPO update and the sampler's decode step for hardware that need not be here and prints
per-device memory, FLOPs and the projected step time (`mle_jax.planner.plan` says how each number is made).

    --target=cpu (default)                 N fake CPU devices
    --target=a100-40|a100-80|h100-80|h200  XLA's deviceless GPU compile (`make aot-env`; run with .aot-venv/bin/python)
    --topology=v5p:2x2x2 (or v4-8, v5e-8)  a TPU slice through libtpu (`make aot-env`; .aot-venv/bin/python):
                                           v4, v5e, v5p, v6e, one device per chip as JAX drives them
    --num_slices=N                         N such slices (or N x --devices), the mesh's data axis across them
                                           (mesh.dcn_data = N; as MaxText's compile_topology_num_slices)
    --targets=v4-8,v5e-8,a100-40:8         several targets in one process (TPU slices, GPU:count)
    --until_fits                           with --targets: a TPU slice that does not fit tries the next size
                                           of its generation; a layout that does not divide takes the fix
                                           its error names
    --table_out=docs/results/x.json        with --targets: one row per plan, with the command and date
    --compare_scan                         also compile the other layer stack (scanned / unrolled)
    --config.a.b=v                         overrides, as in mle_jax.launch

A layout that cannot work (a mesh that does not divide the devices, heads that do not divide the tensor axis,
micro-batches that do not divide over the batch axes, a topology libtpu does not know) ends in one line naming
the numbers that clash.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import ml_collections
from absl import app, flags, logging

from mle_jax.planner import table as plan_table
from mle_jax.planner.errors import PlanError
from mle_jax.planner.plan import format_plan, make_plan
from mle_jax.planner.targets import GPU_TARGETS, make_target
from mle_jax.reporting import provenance
from mle_jax.run.cli import config_flag, fail, parse_flags
from mle_jax.run.settings import ConfigError, RunSettings, from_config

CONFIG = config_flag()

_DEVICES = flags.DEFINE_integer("devices", 0, "devices to plan for (0: all of --topology's chips; else required)")
_MEMORY = flags.DEFINE_float("device_memory_gib", 0.0, "memory of one device in GiB (0: the target's own)")
_TARGET = flags.DEFINE_enum("target", "cpu", ["cpu", *GPU_TARGETS], "what to compile for (see the module doc)")
_TOPOLOGY = flags.DEFINE_string("topology", "", "a TPU topology such as v5p:2x2x2 (compiles with libtpu)")
_OUT = flags.DEFINE_string("out", "", "write the plan as JSON here")
_MFU = flags.DEFINE_float("mfu", 0.4, "model FLOPs utilisation assumed for the projected step time")
_PEAK = flags.DEFINE_float("peak_tflops", None, "dense bf16 peak per device (default: the target's)")
_COMPARE_SCAN = flags.DEFINE_bool("compare_scan", False, "also compile the other layer stack (scanned/unrolled)")
_DECODE = flags.DEFINE_bool("decode", True, "also compile the sampler's decode step")
_UPDATE = flags.DEFINE_bool("update", True, "compile the PPO update (--noupdate: trace it; compile the decode only)")
_SLICES = flags.DEFINE_integer("num_slices", 1, "TPU slices (or groups of --devices) joined over the DCN")
_TARGETS = flags.DEFINE_list("targets", [], "several targets: TPU slices (v4-8, v5e:2x4) and GPU:count (a100-40:8)")
_UNTIL_FITS = flags.DEFINE_bool("until_fits", False, "with --targets: grow a TPU slice until the plan fits")
_TABLE_OUT = flags.DEFINE_string("table_out", "", "with --targets: write the rows as JSON here")


def main(argv: Sequence[str]) -> None:
    del argv
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    cfg = CONFIG.value
    if cfg is None:
        fail("--config is required, e.g. --config=configs/pizza.py")
    if _TARGETS.value:
        sweep(cfg)
        return
    if _TABLE_OUT.value or _UNTIL_FITS.value:
        fail("--table_out and --until_fits go with --targets")
    try:
        settings = with_slices(from_config(cfg), _SLICES.value)
        target = make_target(_TARGET.value, _TOPOLOGY.value, _DEVICES.value, _SLICES.value)
        memory = _MEMORY.value or target.memory_gib
        if memory <= 0:
            raise PlanError(f"--device_memory_gib is required for --target={target.name}")
        plan = make_plan(
            settings, target, memory, _MFU.value, _PEAK.value, _COMPARE_SCAN.value, _DECODE.value, _UPDATE.value
        )
    except (ConfigError, PlanError, FileNotFoundError) as e:
        fail(str(e))
        return
    print(format_plan(plan))
    if _OUT.value:
        provenance.write_json(_OUT.value, {"command": " ".join(["python -m mle_jax.plan", *sys.argv[1:]]), **plan})
        print(f"wrote {_OUT.value}")
    sys.stdout.flush()


def with_slices(s: RunSettings, num_slices: int) -> RunSettings:
    """--num_slices N is mesh.dcn_data = N (a config that sets another dcn_data clashes)."""
    if num_slices != 1 and s.mesh.dcn_data not in (1, num_slices):
        raise PlanError(f"--num_slices={num_slices} but the config has mesh.dcn_data={s.mesh.dcn_data}")
    return dataclasses.replace(s, mesh=dataclasses.replace(s.mesh, dcn_data=max(num_slices, s.mesh.dcn_data)))


def sweep(cfg: ml_collections.ConfigDict) -> None:
    """Plan every --targets entry in this process (one start-up, libtpu and the CUDA plugin loaded once)."""
    if _TOPOLOGY.value or _DEVICES.value:
        fail("--targets replaces --topology and --devices (a GPU entry names its count: a100-40:8)")
    try:
        base = with_slices(from_config(cfg), _SLICES.value)
        results = plan_table.plan_targets(
            base,
            _TARGETS.value,
            _SLICES.value,
            until_fits=_UNTIL_FITS.value,
            mfu=_MFU.value,
            decode=_DECODE.value,
            update=_UPDATE.value,
            overrides=lambda o: with_slices(from_config(with_overrides(cfg, o)), _SLICES.value),
        )
    except (ConfigError, PlanError, FileNotFoundError) as e:
        fail(str(e))
        return
    for row in results["rows"]:
        print(plan_table.format_row(row))
    if _TABLE_OUT.value:
        results["command"] = " ".join(["python -m mle_jax.plan", *sys.argv[1:]])
        results["date"] = time.strftime("%Y-%m-%d")
        Path(_TABLE_OUT.value).write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {_TABLE_OUT.value}")
    sys.stdout.flush()


def with_overrides(cfg: ml_collections.ConfigDict, overrides: dict[str, object]) -> ml_collections.ConfigDict:
    """A copy of the config with dotted overrides ({"ppo.micro_batch_size": 16})."""
    out = ml_collections.ConfigDict(cfg.to_dict())
    for key, value in overrides.items():
        section, field = key.split(".")
        out[section][field] = value
    return out


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # libtpu's and the CUDA plugin's start-up chatter
    # libtpu's lockfile keeps a second process off a TPU host's chips; a plan only compiles (jax_platforms=cpu),
    # so plans may run side by side
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    app.run(main, flags_parser=parse_flags)
