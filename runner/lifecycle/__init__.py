"""The model lifecycle under governance: what changes which models this runner serves.

`loads.LoadManager` (governed loads and unloads, run as tasks any replica can read),
`load_requests` (their bodies, parsed strictly), `governed.GovernedOps` (approve a
governed call, run a cache flush), `adapter_ops.AdapterOps` (governed LoRA adapter loads
and unloads), `gate` (the verifier built from settings),
`catalog` (which models can be loaded and where their files are), `downloads`
(Hugging Face downloads with progress).

May import `engines/`, `scheduler/`, `tasks/`, `telemetry/`, and the floor
(`floor.settings`, the models file); never `http/` (a contract in pyproject.toml).
"""
