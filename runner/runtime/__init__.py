"""The roof: the runner's process, built from every room.

`wiring.Runtime` (everything the runner holds, built once, started and stopped in reverse
order), `scheduling` (the scheduler's configuration), `startup` (the preloads, and how far
they are), `safety` (what start-up refuses, the identity it starts with), `cli`
(`quorum serve` and the operator verbs), `logs` (the log format).

May import every room; no room imports it (the app and the control plane are handed the
built `Runtime` and read it through a protocol of their own, `runner.http.runner_view`).
"""
