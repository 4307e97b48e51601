"""The chaos soak (issue 37, item 5): three runners on a Redis primary with a replica and
three sentinels (or, `--redis cluster`, a three-node Redis Cluster), stand-in engines, one
real llama-server and a fake ComfyUI per runner, under bounded load from several tenants
with token budgets, governed cache-flush tokens and async image jobs, while a schedule
SIGKILLs the Redis primary (a cluster node), a runner and an engine; the invariants are
checked at the end.

`python -m bench.chaos --minutes N [--redis cluster]` runs it and prints the figures
(docs/reliability.md); tests/test_chaos_soak.py runs a short form (one kill of each kind)."""
