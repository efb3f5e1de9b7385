"""spooky-author-identification (MLE-bench).

`spooky.py` = the paper's setup; `spooky.py:cpu` = the embedded CPU run.
"""

from __future__ import annotations

import ml_collections

from configs import base


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
    return base.task_config("spooky-author-identification", arg)
