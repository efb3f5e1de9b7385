"""nomad2018-predict-transparent-conductors (MLE-bench).

`nomad2018.py` = the paper's setup; `nomad2018.py:cpu` = the embedded CPU run.
"""

from __future__ import annotations

import ml_collections

from configs import base


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
    return base.task_config("nomad2018-predict-transparent-conductors", arg)
