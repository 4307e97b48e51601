"""Quorum runner: the HTTP service in front of the inference engines it runs or attaches.

Rooms, one concern each, top to bottom (every folder's `__init__` says what lives there
and what it may import; import-linter keeps the arrows pointing down, `pyproject.toml`;
the picture: docs/architecture.md):

- `runtime/` (the roof): the wiring of the whole, the app built from it, start-up, the CLI;
- `http/`: the ASGI app, the server, connection limits, headers, the request front-end,
  the request paths as peers (the chat path, `audio/`, `images/`, the tenant routes), the
  control plane, the status page, the OpenAPI document;
- `lifecycle/`: governed loads, unloads and flushes, the catalog, downloads; `jobs/`:
  async jobs, their stores and webhooks;
- `telemetry/`: metrics, health, capabilities, the resource snapshot, the status view;
- `engines/`: the engine kinds, the model pool (engines started, watched, stopped),
  launch, probes; `tenancy/`: tenants as the runner applies them (live policy, budgets,
  shared in-flight caps, usage);
- `scheduler/`, `memory/`, `tasks/`: the pure scheduler and its asyncio adapter, GPU
  memory, load tasks;
- `floor/`: settings, the models file, timers, pending writes (read by every room,
  importing none);
- `errors.py`: the runner's error rows and the one mapping of any error to HTTP.
"""

__version__ = "0.1.0"
