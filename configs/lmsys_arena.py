"""lmsys-chatbot-arena (MLE-bench).

`lmsys_arena.py` = the paper's setup; `lmsys_arena.py:cpu` = the embedded CPU run.
"""

from __future__ import annotations

import ml_collections

from configs import base


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
    return base.task_config("lmsys-chatbot-arena", arg)
