"""What the command-line entry points share: the `--config` flag, its one-line errors, `fail`.

launch, plan and the experiments parse their flags with `parse_flags`: a mistake in the command (a config file that
does not exist, an unknown field, a bad value) ends in one line, `error: ...`, with the nearest field when a name is
misspelt, never config_flags' traceback.
"""

from __future__ import annotations

import difflib
import re
import runpy
import sys
from pathlib import Path

from absl import flags
from ml_collections import ConfigDict, config_flags

_CONFIG: list[flags.FlagHolder] = []  # the one --config flag, defined on first use (importing defines no flags)


def config_flag() -> flags.FlagHolder:
    """The `--config=configs/<task>.py[:arg]` flag (with `--config.a.b=v` overrides), defined once per process."""
    if not _CONFIG:
        _CONFIG.append(config_flags.DEFINE_config_file("config", None, "configs/<task>.py[:arg]", lock_config=False))
    return _CONFIG[0]


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
