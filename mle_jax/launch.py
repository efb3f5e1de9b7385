"""python -m mle_jax.launch --config=configs/pizza.py:cpu [--config.a.b=v ...]

A mistake in the command (an unknown config arg or field, a bad value) or something the run needs that is
missing (a model folder, a Docker daemon, a vLLM server, the task's data) ends in one line saying what and
how to fix it, before any work starts; a traceback means a bug.
"""

from __future__ import annotations

import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from mle_jax import preflight
from mle_jax.checkpoint import CheckpointError
from mle_jax.run import run_settings
from mle_jax.settings import ConfigError, from_config

CONFIG = config_flags.DEFINE_config_file("config", None, "configs/<task>.py[:arg]", lock_config=False)


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _one_line(argv: list[str], error: BaseException) -> str:
    """What went wrong while parsing flags, without the traceback config_flags embeds."""
    text = str(error).strip().strip("'\"")
    if isinstance(error, KeyError | AttributeError):  # an override of a config field that does not exist
        key = re.match(r"^\\?'?([\w-]+)", text)
        name = key.group(1) if key else text
        hint = re.search(r'Did you mean "([\w-]+)"', text)
        bad = next((a.split("=")[0] for a in argv if a.startswith("--config.") and f".{name}" in a.split("=")[0]), "")
        fix = f' (did you mean "{hint.group(1)}"?)' if hint else ""
        return f"{bad or name}: no such config field{fix}"
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    flag = next((x for x in lines if x.startswith("flag --")), "")
    last = lines[-1] if lines else text
    return f"{flag.split(':')[0]}: {last}" if flag and last != flag else last


def parse_flags(argv: list[str]) -> list[str]:
    try:
        return flags.FLAGS(argv)
    except (flags.Error, KeyError, AttributeError, ValueError, TypeError) as e:
        fail(_one_line(argv, e))
        raise  # unreachable: _fail exits


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
