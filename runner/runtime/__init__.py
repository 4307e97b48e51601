"""The roof: the runner's process, built from every room.

`wiring.Runtime` (everything the runner holds, built once, started and stopped in reverse
order), `scheduling` (the scheduler's configuration), `startup` (the preloads, and how far
they are), `safety` (what start-up refuses, the identity it starts with), `cli`
(`quorum serve` and the operator verbs), `logs` (the log format).

May import every room; no room imports it, except the request paths' ASGI app and
control plane (`runner.http.app`, `control_plane`, `status_page`, the tenant routes),
which are handed the built `Runtime` and name its type.
"""
