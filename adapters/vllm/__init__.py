"""vLLM: the engine the data path forwards to (`engine`), its command line (`launch`),
the request fields and answers it speaks (`protocol`), per-tenant cache salts (`salts`),
and its own metrics re-exposed on the runner's `/metrics` (`metrics`)."""
