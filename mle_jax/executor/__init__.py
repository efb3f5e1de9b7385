"""Executors: sandbox backends and fleets that run untrusted agent code.

- settings: ExecutorSettings, the `executor` config section typed (limits(), sandbox_options())
- result: ExecResult, Limits, Status, and how a finished run is classified
- backend: what every backend shares (the Sandbox interface, mounts, environment, uids)
- bwrap, docker (+ image, podman): the two backends
- sandbox: make_sandbox(settings), the configured backend
- fleet: Fleet, make_fleet(settings), N sandboxes behind a queue, in this process or on Ray
"""
