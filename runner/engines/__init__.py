"""Engines as the runner holds them: started, probed, measured and stopped.

`pool.ModelPool` (the scheduler's effects: start, stop, sleep engines; the ready engines
the request paths read), `record` (one model's engine facts), `reports` (what the pool
tells the scheduler), `launch` and `backends` (how an engine is started or attached),
`sizing` (memory estimates and policies), `gpus` (placement and leases), the watches
(`attached_watch`, `hang_watch`, `engine_watch`, `probes`).

May import `scheduler/` (its effects protocol and notices), `memory/`, `tasks.eta`, the
settings and models file, and `adapters/`; never `http/`, `lifecycle/` or `telemetry/`.
"""
