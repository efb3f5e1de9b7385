"""learning-agency-lab-automated-essay-scoring-2 (MLE-bench).

`essay_scoring.py` = the paper's setup; `essay_scoring.py:cpu` = the embedded CPU run.
"""

from __future__ import annotations

import ml_collections

from configs import base


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
    return base.task_config("learning-agency-lab-automated-essay-scoring-2", arg)
