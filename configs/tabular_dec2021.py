"""tabular-playground-series-dec-2021 (MLE-bench).

`tabular_dec2021.py` = the paper's setup; `tabular_dec2021.py:cpu` = the embedded CPU run.
"""

from __future__ import annotations

import ml_collections

from configs import base


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
    return base.task_config("tabular-playground-series-dec-2021", arg)
