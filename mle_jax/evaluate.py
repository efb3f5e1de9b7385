"""python -m mle_jax.evaluate --workdir W [--samples N]: evaluates a finished run's latest policy as the paper
does (mle_jax/evaluation.py) and prints our numbers beside the paper's Table 1."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from absl import app, flags

from mle_jax import builders
from mle_jax.evaluation import evaluate, format_table
from mle_jax.executor.fleet import make_fleet
from mle_jax.executor.runtime import sandbox_packages
from mle_jax.rl.rollout import Environment
from mle_jax.settings import from_config
from mle_jax.tasks.prepare import prepare_task

_WORKDIR = flags.DEFINE_string("workdir", None, "a run's workdir", required=True)
_SAMPLES = flags.DEFINE_integer("samples", 0, "samples (0: the run's eval.samples, default 128)")


def main(argv: list[str]) -> None:
    del argv
    workdir = Path(_WORKDIR.value)
    cfg_path = workdir / "config.json"
    if not cfg_path.exists():
        raise app.UsageError(f"{cfg_path} not found: --workdir must be a run's workdir")
    s = from_config({**json.loads(cfg_path.read_text()), "workdir": str(workdir)})
    if _SAMPLES.value:
        s = dataclasses.replace(s, eval=dataclasses.replace(s.eval, samples=_SAMPLES.value))
    task = prepare_task(s.task)
    packages = sandbox_packages()
    model, initial, tokenizer = builders.load_trained_policy(s, task, packages, workdir)
    sampler = builders.make_sampler(s.sampler, model, tokenizer, workdir)
    instrument_fn = builders.make_instrumenter(s, initial, tokenizer, workdir)  # the run's mode, its frozen model
    fleet = make_fleet(s.executor)
    try:
        result = evaluate(s.eval, Environment(s.rollout, task, tokenizer, packages, sampler, instrument_fn, fleet))
    finally:
        fleet.close()
    (workdir / "evaluation.json").write_text(json.dumps(result, indent=2))
    print(format_table(result))


if __name__ == "__main__":
    app.run(main)
