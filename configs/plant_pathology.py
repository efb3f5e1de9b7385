"""plant-pathology-2020-fgvc7 (MLE-bench).

`plant_pathology.py` = the paper's setup; `plant_pathology.py:cpu` = the embedded CPU run.
"""

from __future__ import annotations

import ml_collections

from configs import base


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
    return base.task_config("plant-pathology-2020-fgvc7", arg)
