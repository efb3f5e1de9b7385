"""The samplers by name (`sampler.backend`): name -> "module:Class", imported only on use.

A sampler is one module with one class, plus one line here (or `register(name, "module:Class")` at run time). The
class is a `protocol.Sampler` and carries, as classmethods over the run's `sampler` settings (SamplerSettings: the
fields it reads are its settings):

    name = "<name>"                                         its key here
    from_settings(settings, model, tokenizer, workdir,      the sampler of `model`; url: the server to use instead
                  url=None, frozen=False) -> Sampler        of the section's (the instrumenter's); frozen: of a
                                                            frozen copy of `model` (the instrumenter's)
    preflight(settings, instrumenter_url) -> list[str]      what it needs that is missing, one line each;
                                                            instrumenter_url: instrument.vllm_url when the run
                                                            instruments with an LM, else None
    memory(settings, samplers, device_memory_gib,           its device memory in the plan (mle_jax.plan):
           decode_gib) -> dict                              {"gib", "method", ...}; samplers: how many the run
                                                            holds per device; decode_gib: the compiled in-process
                                                            decode step's peak (0 if not compiled)

This module imports no sampler: the run's settings check a name against it without loading one; the run's builders,
preflight and planner resolve the class.
"""

from __future__ import annotations

from mle_jax.infra.class_registry import ClassRegistry

SAMPLERS = ClassRegistry(
    "sampler.backend",
    {
        "jax": "mle_jax.sampling.jax_sampler:JaxSampler",
        "vllm": "mle_jax.sampling.vllm:VLLMSampler",
    },
)

register = SAMPLERS.register
unregister = SAMPLERS.unregister
names = SAMPLERS.names
check = SAMPLERS.check
resolve = SAMPLERS.resolve
