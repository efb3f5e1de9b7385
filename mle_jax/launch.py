"""python -m mle_jax.launch --config=configs/pizza.py:cpu [--config.a.b=v ...]

A mistake in the command (an unknown config arg or field, a bad value) or something the run needs that is
missing (a model folder, a Docker daemon, a vLLM server, the task's data) ends in one line saying what and
how to fix it, before any work starts; a traceback means a bug.
"""

from __future__ import annotations

from absl import app, flags, logging

from mle_jax.infra.checkpoint import CheckpointError
from mle_jax.run import preflight
from mle_jax.run.cli import config_flag, fail, parse_flags
from mle_jax.run.settings import ConfigError, from_config
from mle_jax.run.stages import run_settings

CONFIG = config_flag()


def main(argv: list[str]) -> None:
    del argv
    if not flags.FLAGS["verbosity"].present:  # orbax logs every checkpoint step at INFO; keep the progress bar readable
        logging.set_verbosity(logging.WARNING)
    cfg = CONFIG.value
    if cfg is None:
        fail("--config is required, e.g. --config=configs/pizza.py:cpu")
    try:
        settings = from_config(cfg)
        preflight.check(settings)
    except (ConfigError, preflight.PreflightError) as e:
        fail(str(e).replace("\n", "\nerror: "))
    try:
        run_settings(settings, config_json=cfg.to_json_best_effort(indent=2))
    except CheckpointError as e:  # --config.resume over checkpoints none of which reads back
        fail(str(e))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
