"""A run's wiring: the config read once into typed settings, the builders, the environment's assembly, preflight,
the run's stages, and the command-line helpers the entry points share.

- settings: `from_config(ConfigDict) -> RunSettings`, the one reader of configs/<task>.py
- builders: policy, critic, samplers, instrumenter, learner from settings
- environment: the one builder of a run's environment (tasks, fleet, sampler, instrumenter)
- preflight: what a run needs, checked before any work (one line per problem)
- stages: warm start -> RL -> evaluation -> export -> report, resumable
- cli: the `--config` flag, its one-line errors, `fail`
"""
