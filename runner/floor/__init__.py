"""The floor: what every room of the runner reads, importing none of them.

`settings` (the environment, read once; the texts of its host and priority lists:
`setting_texts`), `models_file` (the models file), `otlp` (what the `OTEL_*` variables
ask: the runner's traces, and a started engine's), `periodic` (a task on a timer, and how
a task is stopped), `pending_writes` (writes a shared store refused, written again).

May import `runner.errors` and the packages below the runner (`adapters`, `tenants`,
`governance`, `faults`); never a room of the runner (a contract in pyproject.toml).
"""
