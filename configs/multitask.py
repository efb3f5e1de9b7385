"""One policy over a mix of tasks: every task with data here (raw files in data/raw/ and a warm-start corpus),
equal weights. `multitask.py` = the paper's setup; `multitask.py:cpu` = the embedded CPU run (2 cores).

Pick another mix with --config.tasks="('random-acts-of-pizza','spooky-author-identification')" and weigh it with
--config.task_weights="(2.0,1.0)"."""

from __future__ import annotations

import ml_collections

from configs import base
from mle_jax.tasks.prepare import PREPARERS
from mle_jax.warmstart.programs import registered_tasks

MIX = tuple(t for t in sorted(PREPARERS) if t in registered_tasks())  # tasks with data and a corpus


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
    c = base.task_config(MIX[0], arg)
    c.tasks = MIX
    c.task_weights = ()  # equal weights (a --config.tasks override of another length needs no new weights)
    c.workdir = "runs/multitask" if arg == "paper" else f"runs/multitask-{arg}"
    if arg == "cpu":
        c.warmstart.enabled = True  # every task of the mix has a corpus generator
        # the SFT set is the union of the tasks' corpora: as many passes over it as a single task's 150 steps make
        # over its own (a smaller --config.tasks mix may scale this down: 150 per task)
        c.warmstart.steps = 150 * len(MIX)
    return c
