"""mle_jax.infra.op_profile: a Perfetto trace's device ops summed by op and category."""

from __future__ import annotations

import gzip
import json

from mle_jax.infra.op_profile import category, render, summarize
from mle_jax.reporting.results_tables.benchmarks import _device_time


def _trace(path, events):
    meta = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 7, "args": {"name": "Stream #14(Compute)"}},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 8, "args": {"name": "Stream #15(MemcpyH2D)"}},
    ]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": meta + events}, f)


def test_device_kernels_are_summed_by_op_and_category(tmp_path):
    ev = [
        {"ph": "X", "pid": 2, "tid": 7, "name": "nvjet_sm90_tst_256x128", "ts": 0, "dur": 600},
        {"ph": "X", "pid": 2, "tid": 7, "name": "nvjet_sm90_tst_256x128", "ts": 600, "dur": 200},
        {"ph": "X", "pid": 2, "tid": 7, "name": "cudnn_generated_fort_native_sdpa_flash", "ts": 800, "dur": 100},
        {"ph": "X", "pid": 2, "tid": 8, "name": "input_reduce_fusion_3", "ts": 950, "dur": 50},
        {"ph": "X", "pid": 1, "tid": 1, "name": "PjitFunction(update)", "ts": 0, "dur": 5000},  # host: not counted
    ]
    _trace(tmp_path / "t.perfetto_trace.json.gz", ev)
    s = summarize(tmp_path / "t.perfetto_trace.json.gz")
    assert s["busy_ms"] == 0.95 and s["span_ms"] == 1.0
    assert s["by_category"] == {"matmul": 0.8, "attention (cuDNN)": 0.1, "fusion (elementwise, reduce)": 0.05}
    assert s["top"][0]["name"] == "nvjet_sm90_tst_256x128" and s["top"][0]["count"] == 2
    assert "matmul" in render(s)


def test_a_file_summarised_before_a_category_existed_is_relabelled():
    old = {"busy_ms": 10.0, "by_category": {"other": 8.0, "fusion (elementwise, reduce)": 2.0},
           "top": [{"name": "nvjet_sm90_tst", "category": "other", "ms": 7.0}]}  # fmt: skip
    assert category("nvjet_sm90_tst") == "matmul"
    assert _device_time(old) == {"other": 1.0, "fusion (elementwise, reduce)": 2.0, "matmul": 7.0}
