"""us-patent-phrase-to-phrase-matching (MLE-bench).

`us_patent.py` = the paper's setup; `us_patent.py:cpu` = the embedded CPU run.
"""

from __future__ import annotations

import ml_collections

from configs import base


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
    return base.task_config("us-patent-phrase-to-phrase-matching", arg)
