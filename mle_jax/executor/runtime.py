"""The runtime agent code gets: the sandbox venv (`make sandbox-env`) and what really imports in it.

The venv is built from Debian's /usr/bin/python3.11 so the same directory runs inside bwrap (host /usr)
and, bind-mounted read-only, inside the Debian bookworm image of the Docker backend. Both mount it at
VENV_MOUNT.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_MOUNT = "/opt/sandbox-venv"  # where both backends mount the sandbox venv (read-only)

# (name the prompt shows, module to import): the paper's list (§4.1, appendix C).
PAPER_PACKAGES: tuple[tuple[str, str], ...] = (
    ("pandas", "pandas"),
    ("numpy", "numpy"),
    ("scikit-learn", "sklearn"),
    ("xgboost", "xgboost"),
    ("lightgbm", "lightgbm"),
    ("statsmodels", "statsmodels"),
    ("scipy", "scipy"),
    ("torch", "torch"),
    ("bayesian-optimization", "bayes_opt"),
    ("timm", "timm"),
)

_PROBE = """
import importlib, json, sys
ok = []
for name, module in json.loads(sys.argv[1]):
    try:
        importlib.import_module(module)
        ok.append(name)
    except Exception:
        pass
print(json.dumps(ok))
"""


def default_venv() -> Path:
    return Path(os.environ.get("MLE_JAX_SANDBOX_VENV", REPO_ROOT / ".sandbox-venv"))


def venv_of(python: str | Path | None) -> Path:
    """The venv dir of a sandbox interpreter path (config `executor.sandbox_python`; empty: the default)."""
    if not python:
        return default_venv()
    return Path(python).absolute().parent.parent


def check_venv(venv: Path) -> Path:
    """The venv's python, or a loud error saying how to build it."""
    py = venv / "bin" / "python"
    if not py.exists() or not (venv / "pyvenv.cfg").exists():
        raise FileNotFoundError(f"sandbox venv not found at {venv}: run `make sandbox-env` in {REPO_ROOT}")
    return py


def sandbox_packages(venv: str | Path | None = None) -> list[str]:
    """The paper's packages that import in the sandbox venv (probed once per venv build, then cached)."""
    venv = Path(venv) if venv else default_venv()
    py = check_venv(venv)
    stamps = sorted(p.name for p in venv.glob(".installed-*"))
    cache = venv / ".packages.json"
    if cache.exists():
        cached = json.loads(cache.read_text())
        if cached.get("stamps") == stamps:
            return list(cached["packages"])
    out = subprocess.run(
        [str(py), "-c", _PROBE, json.dumps(PAPER_PACKAGES)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    packages = json.loads(out.stdout.strip().splitlines()[-1])
    try:
        cache.write_text(json.dumps({"stamps": stamps, "packages": packages}))
    except OSError:
        pass  # a read-only venv: probe again next time
    return packages
