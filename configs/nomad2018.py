"""nomad2018-predict-transparent-conductors (MLE-bench).

`nomad2018.py` = the paper's setup; `nomad2018.py:cpu` = the embedded CPU run.
"""

from __future__ import annotations

import ml_collections

from configs import base


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
    c = base.task_config("nomad2018-predict-transparent-conductors", arg)
    if arg == "cpu":
        # the one task whose warm start missed the 50% goal at :cpu's 150 SFT steps (its corpus mixes eight
        # regressor families whose keyword arguments the tiny model confused): valid fraction of 32 samples after
        # the warm start, scratch / improve prompts, 0.47 / 0.34 at 150 steps, 0.66 / 0.56 at 300
        # (bench/warmstart_valid_fraction.py --config configs/nomad2018.py:cpu --samples 32 --steps N)
        c.warmstart.steps = 300
    return c
