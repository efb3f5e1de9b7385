"""detecting-insults-in-social-commentary (MLE-bench).

`insults.py` = the paper's setup; `insults.py:cpu` = the embedded CPU run.
"""

from __future__ import annotations

import ml_collections

from configs import base


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
    return base.task_config("detecting-insults-in-social-commentary", arg)
