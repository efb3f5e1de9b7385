"""tweet-sentiment-extraction (MLE-bench).

`tweet_sentiment.py` = the paper's setup; `tweet_sentiment.py:cpu` = the embedded CPU run.
"""

from __future__ import annotations

import ml_collections

from configs import base


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
    return base.task_config("tweet-sentiment-extraction", arg)
