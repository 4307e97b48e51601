"""The runner's process: configuration, the wiring of the whole, start-up and the CLI.

`settings` (environment, read once), `models_file` (the models file), `otlp` (what
the `OTEL_*` variables ask: the runner's traces, and a started engine's), `wiring.Runtime`
(everything the runner holds, built once, started and stopped in reverse order),
`scheduling` (the scheduler's configuration), `startup` (the preloads, and how far they
are), `cli` (`quorum serve` and the operator verbs), `logs`, `periodic` (a task on a
timer, and how a task is stopped), `pending_writes` (writes a shared store refused,
written again).

`settings` and `models_file` are read by every room and import none (a contract in
pyproject.toml); `wiring` and `cli` import them all.
"""
