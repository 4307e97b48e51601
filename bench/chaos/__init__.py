"""The chaos soak (issue 37, item 5): three runners on a Redis primary with a replica and
three sentinels, stand-in engines and one real llama-server, under bounded load from
several tenants with token budgets and governed cache-flush tokens, while a schedule
SIGKILLs the Redis primary, a runner and an engine; the invariants are checked at the end.

`python -m bench.chaos --minutes N` runs it and prints the figures (docs/reliability.md);
tests/test_chaos_soak.py runs a short form (one kill of each kind)."""
