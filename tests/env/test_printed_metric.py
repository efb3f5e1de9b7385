"""Best of K by the agent's own printed metric (mle_jax/env/printed_metric.py): what a run printed, and which of K
programs is handed in."""

from __future__ import annotations

import pytest
from flax import nnx

from configs import base
from mle_jax.env.evaluation import evaluate
from mle_jax.env.printed_metric import choose, printed_metric
from mle_jax.env.rollout import Environment
from mle_jax.env.settings import EvalSettings
from mle_jax.executor.fleet import make_fleet
from mle_jax.instrument import instrument_batch
from mle_jax.instrument.fallback import ast_instrument
from mle_jax.instrument.tagging import tag_progress
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.models.tokenizer import train_bpe_tokenizer
from mle_jax.run.settings import from_config
from mle_jax.tasks.prompts import data_mount
from mle_jax.warmstart.programs import full_grid
from tests.rl.scripted_sampler import ScriptedSampler
from tests.rl.test_loop import pizza as pizza  # the prepared-data fixture
from tests.rl.tiny import tiny_qwen2

TAG = "@@mle0123456789ab@@"


@pytest.mark.unit
def test_the_corpus_programs_print_their_metric_in_their_own_line_and_the_instrumenter_without_a_value():
    """Why the agent's own held-out print is read: in spooky's and pizza's corpus programs the metric is computed
    inside the program's print, so the instrumenter's `testing loss:` line carries no value."""
    for task, own in (("spooky-author-identification", "validation log loss:"), ("random-acts-of-pizza",
                                                                                 "validation auc:")):  # fmt: skip
        code = tag_progress(ast_instrument(full_grid(task)[0].code), TAG)
        assert f'print("{own}",' in code
        assert f'print({TAG!r}, "testing loss:")' in code  # a bare print: nothing to read there


@pytest.mark.unit
def test_the_printed_metric_is_the_tagged_testing_loss_value_else_the_agents_last_held_out_print():
    spooky = f"{TAG} loaded data\n{TAG} trained model\nvalidation log loss: 0.4821\n{TAG} testing loss:\nwrote it\n"
    assert printed_metric(spooky, TAG) == pytest.approx(0.4821)
    assert printed_metric("validation auc: 0.61\nvalidation auc: 6.5e-1\n", None) == pytest.approx(0.65)  # the last
    # the instrumenter's print with a value wins over the program's own line
    both = f"validation auc: 0.61\n{TAG} testing loss: 0.7\n"
    assert printed_metric(both, TAG) == pytest.approx(0.7)
    # an untagged `testing loss:` line is not the instrumenter's (the agent's own progress prints are removed before
    # its program runs) and not a validation line: it is not read
    assert printed_metric("testing loss: 0.3\n", TAG) is None
    # nothing to read: no held-out print, a training loss only, a value on the next line, a non-finite value
    assert printed_metric(f"{TAG} testing loss:\n0.5\nTraceback ...\n", TAG) is None
    assert printed_metric("training loss: 0.2\nmodel accuracy: 0.9\n", None) is None
    assert printed_metric("validation log loss: nan\n", None) is None
    # progress bars end lines with carriage returns
    assert printed_metric("epoch 1\rval loss: 1.5\rval loss: 1.25\r", None) == pytest.approx(1.25)


@pytest.mark.unit
def test_choose_hands_in_the_best_printed_metric_among_formats_that_passed():
    # lower is better (log loss): the lowest printed value among the submissions that passed the format check
    assert choose([0.9, 0.4, 0.2], [True, True, False], lower_is_better=True) == 1
    assert choose([0.9, 0.4, 0.2], [True, True, False], lower_is_better=False) == 0  # AUC: the highest
    assert choose([0.5, 0.5, 0.7], [True, True, True], lower_is_better=True) == 0  # the first of equals
    # passed the check but printed nothing: the last that passed
    assert choose([None, None, 0.1], [True, True, False], lower_is_better=True) == 1
    # nothing passed the check: the best printed value, else the first program
    assert choose([None, 0.3, 0.2], [False, False, False], lower_is_better=True) == 2
    assert choose([None, None, None], [False, False, False], lower_is_better=True) == 0
    assert choose([0.3], [False], lower_is_better=False) == 0
    with pytest.raises(ValueError, match="same"):
        choose([0.1, 0.2], [True], lower_is_better=True)


def _program(prints: str, prediction: str, crash: bool = False) -> str:
    body = f"""import pandas as pd
test = pd.read_json("{data_mount("random-acts-of-pizza")}test.json")
print("validation auc:", {prints})
{"raise RuntimeError('out of memory')" if crash else ""}
sub = pd.DataFrame({{"request_id": test["request_id"], "requester_received_pizza": {prediction}}})
sub.to_csv("submission.csv", index=False)"""
    return f"I will write a submission.\n\n```python\n{body}\n```"


# claims a high held-out AUC but hands in a constant (private AUC 0.5); claims less and ranks by the request's length
# (better than a constant on the private labels); claims the most but dies before writing its submission
CLAIMS_MOST = _program("0.9", "0.3")
HONEST = _program("0.6", 'test["request_text_edit_aware"].str.len().rank(pct=True)')
CRASHES = _program("0.95", "0.3", crash=True)


@pytest.mark.integration
def test_the_evaluation_hands_in_the_best_printed_metric_of_k_draws_never_the_best_private_score(tmp_path, pizza):
    """D = 3 one-turn draws per start prompt through the real bwrap sandbox and grader: the handed-in program is the
    one whose run printed the best held-out AUC among those whose submission passed the format check, though another
    draw scores better on the private labels and a third printed more but wrote no submission."""
    cfg = base.apply_cpu(base.task_config("random-acts-of-pizza", "paper"))
    cfg.workdir = str(tmp_path)
    cfg.prompt.max_prompt_tokens, cfg.sampler.max_tokens = 1536, 256
    s = from_config(cfg)
    texts = (CLAIMS_MOST, HONEST, CRASHES)
    tok = train_bpe_tokenizer(list(texts) * 4, 400, tmp_path / "tok")
    mcfg = tiny_qwen2(len(tok), num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048)
    sampler = ScriptedSampler(Qwen2ForCausalLM(mcfg, rngs=nnx.Rngs(0)), tok, list(texts))
    fleet = make_fleet(s.executor)
    env = Environment(s.rollout, pizza, tok, ["pandas"], sampler, lambda codes: instrument_batch(codes, "ast"), fleet)
    try:
        out = evaluate(EvalSettings(samples=2, improve=False), env, draws=3)
    finally:
        fleet.close()
    draws = out["draw_samples"]
    codes = [r["code"] for r in draws["records"]]
    assert out["turns"] == 1 and out["draws"] == 3 and len(codes) == 6  # the script's three per start prompt
    assert [r["submission_format_ok"] for r in draws["records"]] == [True, True, False] * 2
    handed = out["scratch"]["records"]
    assert [r["code"] for r in handed] == [codes[0]] * 2  # printed 0.9, format passed
    assert out["scratch"]["valid_fraction"] == 1.0 and out["scratch"]["mean"] == pytest.approx(0.5)  # a constant
    honest = draws["records"][1]
    assert honest["valid"] and honest["score"] > 0.5  # the draw the private score would have chosen
    assert draws["best_draw_private"]["mean"] == pytest.approx(honest["score"])
    assert draws["valid_fraction_by_draw"] == [1.0, 1.0, 0.0] and len(draws["duration_s_by_draw"]) == 3
