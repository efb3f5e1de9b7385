"""`python -m mle_jax.plan` for hardware that is not here: every TPU generation (v4 and v5p one device per chip,
megacore; v5e and v6e one core per chip), every GPU target, two TPU slices, and one-line errors for topologies
libtpu cannot make. A tiny config compiled in .aot-venv (libtpu and JAX's CUDA plugin; `make aot-env`), the
plans in four processes run side by side.

Budget: the PPO update (the costly program, ~10 s of CPU each even tiny) is compiled for v4 (the generation
whose layout used to fail), one GPU and the two-slice mesh; the other targets compile the sampler's decode step
(the model's program on that target, through the same devices and mesh) and trace the update."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from mle_jax.planner.errors import PlanError
from mle_jax.planner.targets import GPU_TARGETS, TpuSlice, tpu_slice
from mle_jax.reporting import plan_markdown
from tests.xla_flags import optimised_compile_env

REPO = Path(__file__).resolve().parents[2]
AOT = REPO / ".aot-venv" / "bin" / "python"
# a tiny config whose one micro-batch of 8 rows spreads over 8 chips; 64 tokens
TINY = [
    "--config=configs/pizza.py:cpu",
    "--config.mesh.fsdp=-1",
    "--config.ppo.micro_batch_size=8",
    "--config.prompt.max_prompt_tokens=32",
    "--config.sampler.max_tokens=32",
    "--config.model.num_hidden_layers=1",
]
KINDS = {"v4:2x2x2": "TPU v4", "v5e:2x4": "TPU v5 lite", "v6e:2x4": "TPU v6 lite", "v5p:2x2x2": "TPU v5"}
KINDS |= {f"{name}:8": gpu.name for name, gpu in GPU_TARGETS.items()}
COMPILED = ["v4:2x2x2", "a100-40:8"]  # the update compiled; the others trace it and compile the decode step


def aot_plan(*args: str) -> subprocess.Popen:
    if not AOT.exists():
        pytest.fail(f"{AOT.relative_to(REPO)} is missing: run `make aot-env` (libtpu and JAX's CUDA compile plugin)")
    return subprocess.Popen(
        [str(AOT), "-m", "mle_jax.plan", *TINY, *args],
        cwd=REPO,
        env={**os.environ, **optimised_compile_env()},  # a plan's memory is XLA's optimised compile's
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("aot")
    others = [t for t in KINDS if t not in COMPILED]
    procs = {
        "compiled": aot_plan(f"--targets={','.join(COMPILED)}", "--nodecode", f"--table_out={tmp / 'c.json'}"),
        "decode": aot_plan(f"--targets={','.join(others)}", "--noupdate", f"--table_out={tmp / 'd.json'}"),
        "slices": aot_plan("--targets=v5e:2x2", "--num_slices=2", "--nodecode", f"--table_out={tmp / 's.json'}"),
        "bad_topology": aot_plan("--topology=v4:3x3x3", "--nodecode"),
    }
    done = {name: finish(p) for name, p in procs.items()}
    for name, file in (("compiled", "c"), ("decode", "d"), ("slices", "s")):
        rc, out, err = done[name]
        assert rc == 0, out[-3000:] + err[-3000:]
        done[name] = json.loads((tmp / f"{file}.json").read_text())
    return done


def test_every_tpu_generation_and_gpu_target_compiles(plans):
    rows = {r["entry"]: r for name in ("compiled", "decode") for r in plans[name]["rows"]}
    assert set(rows) == set(KINDS)
    for entry, kind in KINDS.items():
        r = rows[entry]
        assert "error" not in r, r
        assert r["chips"] == 8 and r["device_kind"] == kind and r["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
        p = r["plan"]
        assert p["flops_per_step"] > 0 and p["per_device"]["params_gib"]["policy"] > 0  # the update, traced
        if entry in COMPILED:
            assert p["update_compiled"] and r["fits"] is True and 0 < r["learner_gib"] < r["device_memory_gib"]
            # XLA's memory analysis of the compiled update (the tiny v4 update has reported 0 temporaries since the
            # objectives seam: its arguments and peak are what a compiled plan always has)
            xla = p["per_device"]["xla"]
            assert xla["arguments_gib"] > 0 and xla["peak_gib"] >= xla["arguments_gib"] and "temporaries_gib" in xla
        else:
            assert r["fits"] is None and p["decode"]["xla"]["peak_gib"] > 0  # the decode step, compiled
    v4 = rows["v4:2x2x2"]
    assert v4["target"] == "v4-16" and "megacore: one device per chip" in v4["plan"]["method"]["memory"]
    assert rows["v5p:2x2x2"]["target"] == "v5p-16" and rows["v5e:2x4"]["target"] == "v5e-8"
    assert rows["v6e:2x4"]["device_memory_gib"] == 32 and rows["v5p:2x2x2"]["device_memory_gib"] == 95
    assert plans["compiled"]["command"].startswith("python -m mle_jax.plan ") and plans["compiled"]["date"]


def test_two_slices_send_only_data_parallel_reductions_over_the_dcn(plans):
    (r,) = plans["slices"]["rows"]
    assert "error" not in r, r
    assert r["target"] == "2x v5e-4" and r["chips"] == 8 and r["slices"] == 2 and r["device_kind"] == "TPU v5 lite"
    assert r["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1} and r["fits"] is True
    dcn = r["plan"]["dcn"]
    assert dcn["slices"] == 2 and "xla-tpu-compile" in r["plan"]["method"]["memory"]
    # libtpu's Megascale transfers between the slices: the sums over the data axis carry at least the
    # gradients of policy and critic once (fp32 master weights, sharded over fsdp within a slice)
    sums = dcn["by_op_and_axes"]["dcn all-reduce (sum) over slices"]["gib_per_device_per_call"]
    grads = r["plan"]["per_device"]["params_gib"]["policy"] + r["plan"]["per_device"]["params_gib"]["critic"]
    assert grads <= sums < 2 * grads
    assert all(k.startswith("dcn ") for k in dcn["by_op_and_axes"])  # fsdp's gathers stay inside a slice
    assert dcn["gib_per_device_per_step"] == pytest.approx(
        sum(v["gib_per_device_per_call"] for v in dcn["by_op_and_axes"].values())
    )


def test_table_renders_between_markers(plans):
    """The markdown of a --table_out file, put between a doc's markers (how BUILD.md's TPU tables are made)."""
    table = plan_markdown.markdown(plans["slices"])
    assert "| 2x v5e-4 | 8 | TPU v5 lite | 2, 4, 1 |" in table and "Across the 2 slices of 2x v5e-4 (DCN)" in table
    assert plans["slices"]["command"] in table and plans["slices"]["date"] in table
    doc = "intro\n<!-- table:x -->\nold\n<!-- /table:x -->\nrest\n"
    assert (
        plan_markdown.replace_between_markers(doc, "x", table)
        == f"intro\n<!-- table:x -->\n{table}\n<!-- /table:x -->\nrest\n"
    )
    with pytest.raises(ValueError, match="no <!-- table:y -->"):
        plan_markdown.replace_between_markers(doc, "y", table)
    # two files, one table: the rows in order, both commands named
    both = plan_markdown.markdown(plan_markdown.merge([plans["compiled"], plans["slices"]]))
    assert both.index("| v4-16 |") < both.index("| a100-40 |") < both.index("| 2x v5e-4 |")
    assert plans["compiled"]["command"] in both and plans["slices"]["command"] in both


def test_a_topology_libtpu_cannot_make_fails_in_one_line(plans):
    rc, out, err = plans["bad_topology"]
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert rc == 2 and "Traceback" not in err and len(lines) == 1, err[-2000:]
    assert lines[0].startswith("error: --topology=v4:3x3x3: libtpu: ") and "3x3x3" in lines[0]


@pytest.mark.parametrize(
    "spec, topology, accelerator",
    [
        ("v4-8", "v4:2x2x1", "v4-8"),
        ("v4:2x2x2", "v4:2x2x2", "v4-16"),
        ("v5p-8", "v5p:2x2x1", "v5p-8"),
        ("v5e-8", "v5e:2x4", "v5e-8"),
        ("v5litepod-16", "v5e:4x4", "v5e-16"),
        ("v6e-8", "v6e:2x4", "v6e-8"),
    ],
)
def test_slice_names(spec, topology, accelerator):
    """Cloud TPU's accelerator types count TensorCores on v4 and v5p (two per chip), chips on v5e and v6e."""
    sl = tpu_slice(spec)
    assert sl.topology == topology and sl.accelerator == accelerator
    assert sl.larger().chips == 2 * sl.chips


@pytest.mark.parametrize(
    "spec, says",
    [
        ("v7-8", "not a TPU slice of a known generation"),
        ("v4:2x4", "a v4 topology has 3 dimensions, e.g. v4:2x2x2"),
        ("v5e:2x2x2", "a v5e topology has 2 dimensions"),
        ("v4-6", "v4 slices come in sizes [8, 16, 32"),
    ],
)
def test_unknown_slices_are_one_line_errors(spec, says):
    with pytest.raises(PlanError) as e:
        tpu_slice(spec)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_largest_slice_has_no_larger():
    assert TpuSlice("v5e", "16x16", 256).larger() is None
