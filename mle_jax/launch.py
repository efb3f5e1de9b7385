"""python -m mle_jax.launch --config=configs/pizza.py:cpu [--config.a.b=v ...]

A mistake in the command (an unknown config arg or field, a bad value) or something the run needs that is
missing (a model folder, a Docker daemon, a vLLM server, the task's data) ends in one line saying what and
how to fix it, before any work starts; a traceback means a bug.
"""

from __future__ import annotations

import difflib
import re
import runpy
import sys
from pathlib import Path

from absl import app, flags, logging
from ml_collections import ConfigDict, config_flags

from mle_jax import preflight
from mle_jax.checkpoint import CheckpointError
from mle_jax.run import run_settings
from mle_jax.settings import ConfigError, from_config

CONFIG = config_flags.DEFINE_config_file("config", None, "configs/<task>.py[:arg]", lock_config=False)


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _unquoted(text: str) -> str:
    """config_flags wraps some messages in one pair of quotes: drop that pair, never a quote that closes a name."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _config_spec(argv: list[str]) -> str | None:
    """The value of --config=PATH[:ARG] (or --config PATH[:ARG]) in argv, if given."""
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            return a.split("=", 1)[1]
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _load_config(spec: str) -> ConfigDict | None:
    """The config a --config spec names, loaded as config_flags loads it; None if it does not load."""
    path, _, arg = spec.partition(":")
    try:
        get_config = runpy.run_path(path)["get_config"]
        return get_config(arg) if arg else get_config()
    except Exception:  # the flag parser reports a config that does not load; this only serves a hint
        return None


def _closest_field(cfg: ConfigDict, dotted: str) -> str | None:
    """The existing config field nearest to a misspelt dotted name: the first part that does not exist is replaced
    by the field of its section it is a prefix of, or else the closest by spelling ("ppo.clip" -> "ppo.clip_ratio")."""
    node, done = cfg, []
    for part in dotted.split("."):
        if isinstance(node, ConfigDict) and part in node:
            node, done = node[part], [*done, part]
            continue
        if not isinstance(node, ConfigDict):
            return None
        keys = sorted(node.keys())
        near = [k for k in keys if k.startswith(part)] or difflib.get_close_matches(part, keys, n=1, cutoff=0.6)
        return ".".join([*done, near[0]]) if near else None
    return None


def _one_line(argv: list[str], error: BaseException) -> str:
    """What went wrong while parsing flags, without the traceback config_flags embeds."""
    text = _unquoted(str(error))
    unknown = re.match(r"Unknown command line flag '(config\.[\w.-]+)'", text)
    if unknown or isinstance(error, KeyError | AttributeError):  # an override of a config field that does not exist
        if unknown:
            bad = "--" + unknown.group(1)
        else:
            key = re.match(r"^\\?'?([\w-]+)", text)
            name = key.group(1) if key else text
            flag = (a.split("=")[0] for a in argv if a.startswith("--config.") and f".{name}" in a.split("=")[0])
            bad = next(flag, name)
        spec = _config_spec(argv)
        cfg = _load_config(spec) if spec and bad.startswith("--config.") else None
        near = _closest_field(cfg, bad.removeprefix("--config.")) if cfg is not None else None
        return f"{bad}: no such config field" + (f" (did you mean --config.{near}?)" if near else "")
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    flag = next((x for x in lines if x.startswith("flag --")), "")
    last = lines[-1] if lines else text
    return f"{flag.split(':')[0]}: {last}" if flag and last != flag else last


def _config_file_problem(argv: list[str]) -> str | None:
    """A --config whose file is missing: config_flags defers that error to the first use of the config, where it
    surfaces as a chained traceback."""
    spec = _config_spec(argv)
    if spec is None:
        return None
    path = spec.partition(":")[0]
    if not Path(path).is_file():
        return f"--config={spec}: no config file {path} (the configs are configs/<task>.py, e.g. configs/pizza.py:cpu)"
    return None


def parse_flags(argv: list[str]) -> list[str]:
    problem = _config_file_problem(argv)
    if problem:
        fail(problem)
    try:
        return flags.FLAGS(argv)
    except (flags.Error, KeyError, AttributeError, ValueError, TypeError) as e:
        fail(_one_line(argv, e))
        raise  # unreachable: fail exits


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
