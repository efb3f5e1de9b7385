"""`python -m mle_jax.reporting.results_tables --write | --check` (the package's docstring says what it does)."""

from __future__ import annotations

import sys

from mle_jax.reporting.results_tables.engine import main

sys.exit(main())
