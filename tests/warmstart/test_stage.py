"""The warm-start stage end to end on real pizza data: verify in bwrap, tokenizer, SFT, saved policy."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from configs import pizza as pizza_config
from mle_jax.executor.sandbox import make_sandbox
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.run.builders import local_sampler
from mle_jax.run.settings import from_config
from mle_jax.tasks.prepare import prepare
from mle_jax.warmstart.programs.pizza import PIZZA
from mle_jax.warmstart.stage import warm_start


@pytest.mark.integration
def test_warm_start_stage_trains_saves_and_reloads(raw_data_dir: Path, tmp_path):
    task = prepare(PIZZA, raw_data_dir / PIZZA, tmp_path / "pizza" / "prepared")
    cfg = pizza_config.get_config("cpu")
    cfg.warmstart.corpus_size = 3  # + 3 examples on the improve prompt (improve_fraction 0.5)
    cfg.warmstart.steps = 4
    cfg.warmstart.batch_size = 2
    cfg.warmstart.warmup_steps = 1
    cfg.warmstart.instrument_examples, cfg.warmstart.instrument_eval = 2, 2  # + 2 instrumentation examples (C.3)
    cfg.model.hidden_size, cfg.model.intermediate_size, cfg.model.num_hidden_layers = 64, 128, 1
    cfg.model.num_attention_heads, cfg.model.num_key_value_heads = 2, 1
    rs = from_config(cfg)
    settings, local = rs.warmstart, local_sampler(rs.sampler)
    sandbox = make_sandbox(ExecutorSettings(backend="bwrap"))
    packages = ["numpy", "pandas", "scipy", "scikit-learn"]
    ws = warm_start(settings, task, sandbox, packages, tmp_path / "ws", local, progress=False)
    assert len(ws.verified) == 3 and all(0.5 < v.score < 0.85 for v in ws.verified)
    assert ws.metrics["steps"] == 4 and ws.metrics["final_loss"] < ws.metrics["first_loss"]
    assert (ws.policy_dir / "DONE").is_file() and (ws.policy_dir / "config.json").is_file()
    assert len(ws.tokenizer) <= cfg.model.vocab_size
    assert (
        ws.metrics["examples"] == 8 and ws.metrics["improve_examples"] == 3 and ws.metrics["instrument_examples"] == 2
    )
    assert ws.metrics["instrument_heldout"] == 2 and 0.0 <= ws.metrics["instrument_heldout_accept"] <= 1.0
    assert ws.metrics["prompt_len"] <= cfg.prompt.max_prompt_tokens
    lines = (tmp_path / "ws" / "verified.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(x)["valid"] for x in lines)
    assert all("trained model" in json.loads(x)["output"] for x in lines)  # captured for improve prompts
    assert sorted(v.output for v in ws.verified) == sorted(json.loads(x)["output"] for x in lines)

    # a second call finds the finished stage: same weights back, no program re-run, no SFT
    class NoRuns:
        def run(self, *a, **k):
            raise AssertionError("a verified program was run again")

    again = warm_start(settings, task, NoRuns(), packages, tmp_path / "ws", local, progress=False)
    tokens = jnp.asarray([ws.tokenizer.encode("import numpy as np")], jnp.int32)
    np.testing.assert_allclose(np.asarray(again.model(tokens)), np.asarray(ws.model(tokens)), rtol=1e-5, atol=1e-5)
    assert again.tokenizer.encode("train.json") == ws.tokenizer.encode("train.json")


@pytest.mark.integration
def test_warm_start_with_debug_examples_teaches_and_measures_turn_two(raw_data_dir: Path, tmp_path):
    """debug_fraction > 0 in a conversation of two turns: faulty corpus programs run in bwrap become SFT examples
    (their prompts the conversation's tokens), and held-out faulty programs measure the policy's turn-2 fixes."""
    task = prepare(PIZZA, raw_data_dir / PIZZA, tmp_path / "pizza" / "prepared")
    cfg = pizza_config.get_config("cpu")
    cfg.agent.turns = 2
    cfg.warmstart.corpus_size = 3  # + 3 improve examples; + round(6 * 0.25 / 0.75) = 2 debug examples
    cfg.warmstart.debug_fraction, cfg.warmstart.debug_eval = 0.25, 1
    cfg.warmstart.steps, cfg.warmstart.batch_size, cfg.warmstart.warmup_steps = 2, 2, 1
    cfg.warmstart.instrument_examples = 0
    cfg.model.hidden_size, cfg.model.intermediate_size, cfg.model.num_hidden_layers = 64, 128, 1
    cfg.model.num_attention_heads, cfg.model.num_key_value_heads = 2, 1
    rs = from_config(cfg)
    packages = ["numpy", "pandas", "scipy", "scikit-learn"]
    sandbox = make_sandbox(ExecutorSettings(backend="bwrap"))
    ws = warm_start(rs.warmstart, task, sandbox, packages, tmp_path / "ws", local_sampler(rs.sampler), progress=False)
    m = ws.metrics
    assert m["debug_context"] == "conversation" and m["debug_faults_run"] == 2 and m["debug_examples"] == 2
    assert m["examples"] == 3 + 3 + 2
    assert m["prompt_len"] > cfg.prompt.max_prompt_tokens // 2  # scratch prompt + turn 1 + observation
    assert m["debug_heldout"] == 1 and 0.0 <= m["debug_heldout_fix_share"] <= 1.0
    [record] = [json.loads(x) for x in (tmp_path / "ws" / "debug_heldout.jsonl").read_text().splitlines()]
    assert record["fault_status"] == "error" and record["prompt_tokens"] > m["prompt_len"] // 2
    runs = [json.loads(x) for x in (tmp_path / "ws" / "faults.jsonl").read_text().splitlines()]
    assert len(runs) == 3 and all(r["run"]["observation"]["status"] == "error" for r in runs)
    assert json.loads((ws.policy_dir / "DONE").read_text())["debug_heldout_fix_share"] == m["debug_heldout_fix_share"]
