"""Tasks CLI.

python -m mle_jax.tasks list
python -m mle_jax.tasks prepare <task-id> [--raw DIR] [--out DIR]
python -m mle_jax.tasks grade <task-id> <submission.csv> --answers PATH
    prints {"valid", "score", "reason", "medal"}: medal is the MLE-bench level a valid submission's score
    earns ("gold", "silver", "bronze", "above_median" or "none"; mle_jax/tasks/medals.py), null when invalid
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mle_jax.tasks.graders import grade_csv
from mle_jax.tasks.medals import medal
from mle_jax.tasks.prepare import PREPARERS, RAW_DATA_DIR, prepare
from mle_jax.tasks.registry import all_specs, get_spec


def _cmd_list(_args: argparse.Namespace) -> int:
    table = Table(title="MLE-bench tasks of the paper")
    for col in ("id", "metric", "better", "data here", "preparer"):
        table.add_column(col, no_wrap=True)
    for s in all_specs():
        better = "lower" if s.lower_is_better else "higher"
        here, preparer = ("yes" if s.has_data_here else ""), ("yes" if s.id in PREPARERS else "")
        table.add_row(s.id, s.metric, better, here, preparer)
    Console(width=120).print(table)
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    raw = Path(args.raw)
    if (raw / args.task_id).is_dir():  # accept the folder of all raw tasks too
        raw = raw / args.task_id
    out = Path(args.out) if args.out else Path("data/tasks") / args.task_id / "prepared"
    task = prepare(args.task_id, raw, out)
    print(json.dumps({"task": task.id, "public": str(task.public_dir), "private": str(task.private_dir)}))
    return 0


def _cmd_grade(args: argparse.Namespace) -> int:
    spec = get_spec(args.task_id)
    answers = Path(args.answers)
    if answers.is_dir():  # a prepared/ or private/ folder
        folder = answers / "private" if (answers / "private").is_dir() else answers
        answers = folder / spec.answers_file
    result = grade_csv(spec, args.submission, answers)
    print(json.dumps({**result.to_json(), "medal": medal(spec.id, result.score) if result.valid else None}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mle_jax.tasks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the 12 tasks").set_defaults(fn=_cmd_list)
    p = sub.add_parser("prepare", help="raw Kaggle files -> MLE-bench prepared/ folder (idempotent)")
    p.add_argument("task_id")
    p.add_argument(
        "--raw", default=str(RAW_DATA_DIR), help="folder of the task's raw files, or of all tasks' (default: data/raw)"
    )
    p.add_argument("--out", default="", help="prepared/ folder to write (default data/tasks/<id>/prepared)")
    p.set_defaults(fn=_cmd_prepare)
    g = sub.add_parser("grade", help="grade a submission CSV; prints JSON {valid, score, reason, medal}")
    g.add_argument("task_id")
    g.add_argument("submission")
    g.add_argument("--answers", required=True, help="answers CSV (or its prepared/ or private/ folder)")
    g.set_defaults(fn=_cmd_grade)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (KeyError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
