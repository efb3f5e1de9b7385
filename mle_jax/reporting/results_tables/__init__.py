"""The result tables and quoted figures of README.md, BUILD.md and the docs/*.md pages, written from the files in
docs/results.

    python -m mle_jax.reporting.results_tables --write    rewrite every marked block of those documents
    python -m mle_jax.reporting.results_tables --check    exit 1, with a diff naming each block that differs

A block is a table between `<!-- table:NAME -->` and `<!-- /table:NAME -->` lines, or one figure inline in a
sentence between `<!-- figure:NAME -->` and `<!-- /figure:NAME -->`. `registry.REGISTRY` maps NAME to the results
files it reads (JSON, or JSONL: a list of records) and the function that renders them (loaded files, in order ->
markdown). To add a table: write its renderer in the module of its kind of source (below), register it with one
line in registry.py, for example

    "duration_bias": Entry((f"{RESULTS}/duration_bias.jsonl",), render_duration_bias),

put the two marker lines where it goes (any document; a block may appear in several, each occurrence checked)
and run `--write`. tests/reporting/test_results_tables.py fails when a document's
block differs from what its renderer writes now, when a marker names no entry or an entry has no marker, and when
a results file an entry reads has no `command` and `date` (`mle_jax.reporting.provenance` stamps them), except the
files in `registry.LEGACY`, which were written before the producing commands recorded them.

- engine: the markers, a block rendered, the documents rewritten or checked; `main`, the command
- registry: `REGISTRY` (a block's results files and renderer) and `LEGACY`
- sources: where the results files are and how they are read
- learning: the learning experiment's summaries, and the task mix's evidence beside them
- ablations: the learning experiment's instrumentation and self-improvement arms (the paper's Fig. 9, Table 4)
- turns: the learning experiment's --turns arms: revising (K-turn episodes) against resampling (best of K)
- duration_bias: the simulated duration-bias update
- search: search at test time against independent samples, MLE-bench's and ML-Agent's protocols
- benchmarks: the benchmarks table (`render_benchmarks`) and the objectives' update step
- smollm2: bench/smollm2_pizza.py's lines
- plans: the planner's --table_out files
- tiers: the test suite's tiers and their times
Numbers are written by mle_jax.reporting.markdown (`number`, `plus_minus`, `signed`, `minutes`), as are the tables.
"""

from __future__ import annotations

from mle_jax.reporting.results_tables.engine import main

__all__ = ["main"]
