"""Quorum runner: the HTTP service in front of the inference engines it runs or attaches.

Rooms, one concern each (every folder's `__init__` says what lives there and what it may
import; import-linter keeps the arrows, `pyproject.toml`):

- `http/`: the ASGI app, the server, connection limits, headers, the request front-end,
  the chat path, the control plane, the status page, the OpenAPI document;
- `lifecycle/`: governed loads, unloads and flushes, the catalog, downloads;
- `engines/`: the model pool (engines started, watched, stopped), launch, probes;
- `telemetry/`: metrics, health, capabilities, the resource snapshot, the status view;
- `runtime/` (the roof): the wiring of the whole, start-up, the CLI;
- `floor/`: settings, the models file, timers, pending writes (read by every room,
  importing none);
- `tenancy/`: tenants as the runner applies them (live policy, budgets, shared in-flight
  caps, usage, the tenant routes);
- `scheduler/`, `memory/`, `jobs/`, `tasks/`, `audio/`, `images/` as named;
- `errors.py`: the runner's error rows and the one mapping of any error to HTTP.
"""

__version__ = "0.1.0"
