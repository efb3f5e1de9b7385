"""Stand-in for `mlebench.utils`: the two names the vendored graders import, as MLE-bench defines them."""

from __future__ import annotations

import logging

import pandas as pd


def get_logger(name: str, level: int = logging.INFO) -> logging.Logger:
    """MLE-bench's logger (without its basicConfig side effect on the test process)."""
    logger = logging.getLogger(name)
    logger.setLevel(level)
    return logger


def read_csv(*args, **kwargs) -> pd.DataFrame:
    """MLE-bench's read_csv: pandas with round-trip float parsing (pandas 3's default), and an empty file read
    as an empty frame."""
    try:
        return pd.read_csv(*args, **kwargs)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
