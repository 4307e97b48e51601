"""bench/tenants: the cost and the guarantees of tenant policy (issue 26)."""
