"""Engines as the runner holds them: their kinds, started, probed, measured and stopped.

`kinds` (the one table from a model's `backend` to its engine kind, adapters/kind.py, and
a load's parameters), `specs` (the catalog: the models this runner knows and their
policies), `sizing` (memory estimates and policies, from the model's files on disk),
`pool.ModelPool` (the scheduler's effects: start, stop, sleep engines) and `launcher` (how
it starts one), `ready` (the engines ready to serve: the one map the request paths read),
`adapters` (the LoRA adapters: declared, governed, bound to tenants, their requests
counted), `record` (one model's engine facts), `reports` (what the pool tells the
scheduler), `gpus` (placement, leases, what kinds are lent), `watch` (the one watch:
probes, revivals, the engines' own figures) and `probes` (the tally of missed probes, the prober).

May import `scheduler/` (its effects protocol, notices and refusals), `memory/`,
`tasks.eta`, `tenants` (who may use an adapter), the floor (`floor.settings`,
`floor.models_file`, `floor.periodic`, `floor.otlp`) and `adapters/`; never `http/`,
`lifecycle/` or `telemetry/` (a contract in pyproject.toml).
"""
