"""Executors: sandbox backends and fleets that run untrusted agent code.

- settings: ExecutorSettings, the `executor` config section typed (limits())
- result: ExecResult, Limits, Status, and how a finished run is classified
- backend: what every backend shares (the Sandbox interface, mounts, environment, uids)
- bwrap, docker (+ image, podman): the two backends
- registry: the backends by name (executor.backend -> "module:Class", imported on use)
- sandbox: make_sandbox(settings), the configured backend; sandbox_problems(settings), its preflight
- fleet: Fleet, make_fleet(settings), N sandboxes behind a queue, in this process or on Ray
"""
