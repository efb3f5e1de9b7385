"""The learning experiment: does RL on the real loop make the agent better, and do the duration weights matter
there? `python -m mle_jax.experiments.learning` (its __main__.py says how it runs and what it writes).

- arms: the arms (an objective and a duration-weight mode each) and their run configs; the scale
- running: the warm start, each arm's RL and evaluations, cached for resuming; peak memory, the wall-time ledger
- outcomes: what the evaluations and logs say: kinds of solution, the corpus's slower-and-better kinds, lags
- report: report.md from the summary
- plots: the report's plots
"""
