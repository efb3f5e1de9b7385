"""Warm start for revising: the share of held-out faulty programs the warm-started policy fixes at turn 2.

    PYTHONPATH=. .venv/bin/python bench/warmstart_debug.py [--config configs/spooky.py:cpu] [--turns 3]
        [--context conversation] [--debug_fraction 0.34] [--baseline] [--workdir DIR] [--out FILE.json]
        [--set warmstart.verify_timeout_s=600 ...] [--remeasure]

Runs the warm-start stage of the config (corpus -> verify in the sandbox -> faulty corpus programs run in the
sandbox -> task tokenizer -> SFT -> the held-out turn-2 measurement, mle_jax/warmstart/debug.py) with episodes of
--turns turns in --context and `warmstart.debug_fraction` = --debug_fraction; with --baseline, the same stage again
without debug examples (debug_fraction 0), measured on the same held-out faulty runs: the peer that tells a policy
that learned to answer an error from one that writes any valid program. The stage of an arm lives in
<workdir>/warmstart (debug arm: the layout of a `python -m mle_jax.launch` run with the same config, so a launched run
is resumed or loaded, not redone) and <workdir>/baseline/warmstart; the baseline reuses the debug arm's cached runs
(the same programs). --remeasure runs the held-out measurement again for an arm whose stage had finished (its
DONE metrics kept as *_at_stage). Prints each arm's metrics; --out writes them as JSON with the command and date.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from mle_jax.executor.sandbox import make_sandbox
from mle_jax.run.builders import local_sampler
from mle_jax.run.environment import prepare_mix
from mle_jax.run.settings import from_config
from mle_jax.warmstart.stage import measure_turn_two, sft_programs, warm_start

CACHES = ("verified.jsonl", "faults.jsonl")
KEPT = (
    "corpus", "corpus_score_mean", "examples", "improve_examples", "instrument_examples", "steps", "first_loss",
    "final_loss", "wall_s", "prompt_len", "response_len", "instrument_heldout_accept",
)  # fmt: skip


def load_config(spec: str):
    """configs/<task>.py[:arg] -> its ConfigDict."""
    path, _, config_arg = spec.partition(":")
    mod_spec = importlib.util.spec_from_file_location("bench_cfg", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.get_config(config_arg) if config_arg else mod.get_config()


def arm(s, tasks, sandbox, packages, workdir: Path, remeasure: bool) -> dict:
    t0 = time.perf_counter()
    finished = (workdir / "policy" / "DONE").is_file()
    ws = warm_start(
        s.warmstart, tasks[0] if len(tasks) == 1 else tasks, sandbox, packages, workdir, local_sampler(s.sampler)
    )
    m = ws.metrics
    out = {k: m[k] for k in KEPT if k in m} | {k: v for k, v in m.items() if k.startswith("debug_")}
    out["stage_s_this_call"] = round(time.perf_counter() - t0, 1)  # a resumed or loaded stage: its remainder
    if finished and remeasure:  # the held-out turn 2 again, on the saved policy (its DONE metrics kept beside)
        if len(tasks) != 1:
            raise SystemExit("--remeasure takes a run of one task")
        in_sft = sft_programs(s.warmstart, tasks, packages, [ws.verified])
        again = measure_turn_two(
            s.warmstart, tasks, sandbox, packages, in_sft, ws.model, ws.tokenizer, workdir, local_sampler(s.sampler)
        )
        out |= {f"{k}_at_stage": v for k, v in out.items() if k.startswith("debug_heldout")} | again
        out["remeasured"] = True
    records = workdir / "debug_heldout.jsonl"
    if records.is_file():
        keys = ("task", "kind", "fault", "fault_status", "prompt_tokens", "status", "last_line", "fixed", "exact",
                "repeat", "similarity", "same_solution", "score")  # fmt: skip
        out["heldout"] = [{k: r.get(k) for k in keys} for r in map(json.loads, records.read_text().splitlines())]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/spooky.py:cpu")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--context", default="conversation", choices=["conversation", "state"])
    ap.add_argument("--debug_fraction", type=float, default=0.34)
    ap.add_argument("--baseline", action="store_true", help="also the stage without debug examples")
    ap.add_argument("--workdir", default="")
    ap.add_argument("--out", default="", help="write the results here as JSON")
    ap.add_argument(
        "--remeasure", action="store_true", help="measure held-out turn 2 again for an arm whose stage had finished"
    )
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a config override (repeatable)")
    args = ap.parse_args()
    cfg = load_config(args.config)
    for item in args.set:
        field, _, value = item.partition("=")
        section, name = field.rsplit(".", 1)
        node = cfg
        for part in section.split("."):
            node = node[part]
        try:
            node[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            node[name] = value
    cfg.agent.turns, cfg.agent.context = args.turns, args.context
    cfg.warmstart.debug_fraction = args.debug_fraction
    s = from_config(cfg)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="mle-jax-warmstart-debug-"))
    tasks, packages = prepare_mix(s)
    sandbox = make_sandbox(s.executor)
    results = {"debug": arm(s, tasks, sandbox, packages, workdir / "warmstart", args.remeasure)}
    if args.baseline:
        base_dir = workdir / "baseline" / "warmstart"
        base_dir.mkdir(parents=True, exist_ok=True)
        for name in CACHES:  # the same programs' runs: copied, not run again
            if (workdir / "warmstart" / name).is_file() and not (base_dir / name).is_file():
                shutil.copy(workdir / "warmstart" / name, base_dir / name)
        base = dataclasses.replace(s.warmstart, debug_fraction=0.0)
        results["baseline"] = arm(
            dataclasses.replace(s, warmstart=base), tasks, sandbox, packages, base_dir, args.remeasure
        )
    for name, r in results.items():
        shares = {k: round(v, 3) for k, v in r.items() if k.startswith("debug_heldout_")}
        print(f"{name}: {r.get('debug_examples', 0)} debug examples of {r['examples']}; held-out turn 2: {shares}")
    if args.out:
        record = {
            "command": "PYTHONPATH=. .venv/bin/python " + " ".join(sys.argv),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": f"{os.cpu_count()} CPUs, shared (load average at the end {os.getloadavg()[0]:.1f})",
            "config": args.config,
            "overrides": {
                "agent.turns": args.turns,
                "agent.context": args.context,
                "warmstart.debug_fraction": args.debug_fraction,
                **dict(item.partition("=")[::2] for item in args.set),
            },
            "sampling": dataclasses.asdict(s.rollout.sampling),
            "arms": results,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
