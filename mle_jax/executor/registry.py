"""The sandbox backends by name (`executor.backend`): name -> "module:Class", imported only on use.

A backend is one module with one class, plus one line here (or `register(name, "module:Class")` at run time).
The class carries:

    name = "<name>"                                    its key here
    options(settings: ExecutorSettings) -> dict        classmethod: its constructor options that the `executor`
                                                       config section decides (the fields it reads)
    preflight(settings: ExecutorSettings) -> list[str] classmethod: what it needs that is missing, one line each
    __init__(**options, work_root, out_root, keep_work) the host's run folders (see `sandbox.make_sandbox`)
    run(code, task, limits) -> ExecResult              the `backend.Sandbox` interface

This module imports no backend: `ExecutorSettings` checks a name against it without loading one;
`sandbox.make_sandbox` and `sandbox.sandbox_problems` resolve the class.
"""

from __future__ import annotations

from mle_jax.infra.class_registry import ClassRegistry

SANDBOXES = ClassRegistry(
    "executor.backend",
    {
        "bwrap": "mle_jax.executor.bwrap:BwrapSandbox",
        "docker": "mle_jax.executor.docker:DockerSandbox",
    },
)

register = SANDBOXES.register
unregister = SANDBOXES.unregister
names = SANDBOXES.names
check = SANDBOXES.check
resolve = SANDBOXES.resolve
