"""llama.cpp's `llama-server`: the engine (`engine`: slots per tenant, saved and restored
caches), its command line and request fields (`protocol`), and the slot choice (`slots`,
pure)."""
