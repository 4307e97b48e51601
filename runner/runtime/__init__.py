"""The runner's process: configuration, the wiring of the whole, start-up and the CLI.

`settings` (environment, read once), `models_file` (the models file), `wiring.Runtime`
(everything the runner holds, built once), `startup` (the preloads' progress), `cli`
(`quorum serve` and the operator verbs), `logs`, `periodic` (a task on a timer),
`pending_writes` (writes a shared store refused, written again).

`settings` and `models_file` are read by every room; `wiring` and `cli` import them all.
"""
