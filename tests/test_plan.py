"""`python -m mle_jax.plan`: the compiled memory and FLOP plan of a run config, on 4 fake CPU devices (a tiny
model; the 3B figures are in BUILD.md), and its one-line errors for layouts that cannot work."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configs import pizza
from mle_jax.planner.errors import PlanError
from mle_jax.planner.plan import format_plan, make_plan
from mle_jax.planner.targets import Target, cpu_target
from mle_jax.run.settings import from_config
from tests.xla_flags import optimised_compile_env

REPO = Path(__file__).resolve().parents[1]
TINY = ["--config=configs/pizza.py:cpu", "--config.mesh.fsdp=-1"]


def run_plan(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The plan CLI in a fresh process (the fake CPU devices are made before JAX starts)."""
    env = {**os.environ, **optimised_compile_env()}  # a plan's memory is XLA's optimised compile's
    return subprocess.run([sys.executable, "-m", "mle_jax.plan", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def tiny_plan(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    done = run_plan(*TINY, "--devices=4", "--device_memory_gib=2", f"--out={out}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "FITS" in done.stdout and "XLA temporaries" in done.stdout  # the table
    return json.loads(out.read_text())


def test_plan_reports_memory_flops_and_fit_per_device(tiny_plan):
    p = tiny_plan
    s = from_config(pizza.get_config("cpu"))
    m = s.model
    assert p["devices"] == 4 and p["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    d = p["per_device"]
    # parameters: exact shard sizes. fsdp=4 splits every weight with an "embed" axis; norms are replicated
    layer = m.hidden_size * m.head_dim * (2 * m.num_attention_heads + 2 * m.num_key_value_heads)
    layer += 3 * m.hidden_size * m.intermediate_size
    n_policy = m.num_hidden_layers * layer + m.vocab_size * m.hidden_size
    split = n_policy * 4 / 4 / 2**30  # float32 master params over 4 devices
    assert split <= d["params_gib"]["policy"] < 1.05 * split
    assert d["optimizer_gib"] == pytest.approx(2 * (d["params_gib"]["policy"] + d["params_gib"]["critic"]), rel=0.01)
    xla = d["xla"]
    assert xla["temporaries_gib"] > 0 and xla["arguments_gib"] >= d["params_gib"]["policy"]
    assert d["learner_gib"] == pytest.approx(
        xla["arguments_gib"] + xla["outputs_gib"] - xla["aliased_gib"] + xla["temporaries_gib"] + xla["code_gib"]
    )
    assert d["total_gib"] == pytest.approx(d["learner_gib"] + d["sampler_gib"])
    assert p["fits"] is (d["total_gib"] <= 2.0) is True
    # FLOPs: the analytic count of the update's matmuls (2 per multiply-add): per token, the reference and the
    # critic forward once, then policy and critic forward + backward (3x a forward); plus causal attention in
    # blocks of attn_block queries (each block sees the keys up to its end); the policy head once more, as the
    # logit chunks are recomputed in the backward pass
    b, t = p["config"]["batch"], p["config"]["seq_len"]
    backbone = 2 * m.num_hidden_layers * layer
    head = 2 * m.vocab_size * m.hidden_size * math.ceil(t / s.learner.ppo.logits_chunk) * s.learner.ppo.logits_chunk / t
    keys = sum(min(a + m.attn_block, t) for a in range(0, t, m.attn_block)) * m.attn_block / t
    attention = m.num_hidden_layers * 4 * keys * m.num_attention_heads * m.head_dim
    per_token = 4 * (backbone + attention) + 5 * head + 4 * (backbone + attention)  # 5: the chunks are remat
    assert p["flops_per_step"] == pytest.approx(b * t * per_token, rel=0.05)
    assert p["xla_flops_per_device_loop_bodies_once"] < p["flops_per_step"] / 4  # why XLA's figure is not used
    assert p["compile_s"] > 0 and p["decode"]["kv_cache_gib"] > 0
    assert set(p["method"]) >= {"memory", "flops", "sampler"} and "xla-cpu" in p["method"]["memory"]


@pytest.fixture(scope="module")
def cpu_plans() -> dict[str, dict]:
    """In process, on this process's one CPU device, a device of 10 MiB: the :cpu config's plan with PPO and with
    GRPO (groups of 4 for both: GRPO compares within groups; the plans differ only in the objective). Each plan
    compiles its update, so the tests below share these two."""
    plans = {}
    for algorithm in ("ppo", "grpo"):
        cfg = pizza.get_config("cpu")
        cfg.learner.algorithm = algorithm
        cfg.sampler.group_size = 4
        plans[algorithm] = make_plan(from_config(cfg), cpu_target(1), device_memory_gib=0.01, decode=False)
    return plans


def test_plan_says_when_it_does_not_fit(cpu_plans):
    """A device too small for the learner does not fit."""
    p = cpu_plans["ppo"]
    assert p["devices"] == 1 and p["fits"] is False and p["per_device"]["total_gib"] > 0.01
    assert "DOES NOT FIT" in format_plan(p)


def settings_with(**overrides: object):
    cfg = pizza.get_config("cpu")
    cfg.mesh.fsdp = -1
    for key, value in overrides.items():
        section, field = key.split("__")
        cfg[section][field] = value
    return from_config(cfg)


@pytest.mark.parametrize(
    "overrides, says",
    [
        ({"mesh__data": 3}, "mesh: 4 devices cannot be split into data/fsdp/tensor = [3, -1, 1]"),
        ({"mesh__fsdp": 2}, "mesh: mesh data/fsdp/tensor = [1, 2, 1] needs 2 devices, have 4"),
        (
            {"mesh__fsdp": 1, "mesh__tensor": 4, "model__num_attention_heads": 6},
            "model.num_attention_heads=6 is not a multiple of mesh.tensor=4",
        ),
        (
            {"ppo__micro_batch_size": 2},
            "ppo.micro_batch_size=2 is not a multiple of mesh data*fsdp = 1*4 = 4: set --config.ppo.micro_batch_size=4",
        ),
    ],
)
def test_bad_layouts_are_plan_errors(overrides, says):
    """Checked before any device is touched: the target's devices are only counted here."""
    target = Target([None] * 4, "cpu", "cpu", "-", 0.0, 0.0, 0.0)
    with pytest.raises(PlanError) as e:
        make_plan(settings_with(**overrides), target, device_memory_gib=1.0)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert e.value.fix == ({"ppo.micro_batch_size": 4} if "set --config" in says else {})  # what --until_fits applies


def test_cli_errors_are_one_line():
    done = run_plan(*TINY, "--devices=4", "--device_memory_gib=1", "--config.mesh.data=3", timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    err = done.stderr.strip()
    assert "Traceback" not in done.stderr and len(err.splitlines()) == 1, err
    assert err == "error: mesh: 4 devices cannot be split into data/fsdp/tensor = [3, -1, 1]", err


def test_a_critic_free_objective_plans_no_critic_and_less_memory(cpu_plans):
    """The GRPO update holds no critic, no critic moments and no critic pass, so its per-device total is below
    PPO's for the same config; its FLOPs lack the critic's forward and backward."""
    plans = cpu_plans
    ppo, grpo = plans["ppo"]["per_device"], plans["grpo"]["per_device"]
    assert plans["grpo"]["config"]["algorithm"] == "grpo" and grpo["params_gib"]["critic"] == 0.0
    assert ppo["params_gib"]["critic"] > 0 and grpo["params_gib"]["policy"] == ppo["params_gib"]["policy"]
    # Adam's two moments of the policy alone: half of PPO's (the critic is the policy's backbone plus a scalar head)
    assert grpo["optimizer_gib"] == pytest.approx(2 * grpo["params_gib"]["policy"], rel=0.01)
    assert grpo["optimizer_gib"] < 0.55 * ppo["optimizer_gib"]
    assert grpo["xla"]["arguments_gib"] < ppo["xla"]["arguments_gib"]
    assert grpo["total_gib"] < ppo["total_gib"] and grpo["learner_gib"] < ppo["learner_gib"]
    assert plans["grpo"]["flops_per_step"] < 0.75 * plans["ppo"]["flops_per_step"]
    assert "learner.algorithm grpo" in format_plan(plans["grpo"])
