"""python -m mle_jax.launch --config=configs/pizza.py:cpu [--config.a.b=v ...]"""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/<task>.py[:arg]", lock_config=False)


def main(argv: list[str]) -> None:
    del argv
    if not flags.FLAGS["verbosity"].present:  # orbax logs every checkpoint step at INFO; keep the progress bar readable
        logging.set_verbosity(logging.WARNING)
    from mle_jax.run import run

    run(_CONFIG.value)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
