"""python -m mle_jax.launch --config=configs/pizza.py:cpu [--config.a.b=v ...]"""

from __future__ import annotations

from absl import app
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/<task>.py[:arg]", lock_config=False)


def main(argv: list[str]) -> None:
    del argv
    from mle_jax.run import run

    run(_CONFIG.value)


if __name__ == "__main__":
    config_flags.mark_flags_as_required(["config"])
    app.run(main)
