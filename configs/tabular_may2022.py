"""tabular-playground-series-may-2022 (MLE-bench).

`tabular_may2022.py` = the paper's setup; `tabular_may2022.py:cpu` = the embedded CPU run.
"""

from __future__ import annotations

import ml_collections

from configs import base


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
    return base.task_config("tabular-playground-series-may-2022", arg)
