"""random-acts-of-pizza. `pizza.py` = the paper's setup; `pizza.py:cpu` = the embedded CPU run;
`pizza.py:smol` = the embedded run with SmolLM2-135M-Instruct (`make smol-model`)."""

from __future__ import annotations

import ml_collections

from configs import base


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
    return base.task_config("random-acts-of-pizza", arg)
