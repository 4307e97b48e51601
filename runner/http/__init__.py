"""HTTP: everything that speaks to a client.

`app.RunnerApp` (the ASGI app and its lifespan), `server` (uvicorn, SIGTERM), `limits`
and `coalesce` (what one connection may cost, one write per answer), `uvicorn_seam` (the
only import of uvicorn's private protocol; refuses an untested uvicorn), `headers` (request
headers, pure), `frontend.FrontEnd` (the one request front-end: identify, rate limit,
errors, usage; it calls a path's `serve`), `call.ClientCall` (one request's record),
`path_gate.PathGate` (what a path asks on its way: the model, token budgets, the
admission scope `admitted.Admitted`), the request paths, peers: `chat` and `body_checks`
(the text inference path), `audio/` (transcriptions, translations), `images/` (image
generation and its files),
`control_plane` (FastAPI routes: health, capabilities, lifecycle, jobs, logs),
`tenant_routes` (`/v1/tenants`, `/v1/usage`), `status_page` (`/ui`), `openapi/` (the
OpenAPI document), `ui/` (the page's files), `traced` (the server span and the engine
call's span, tracing on), `runner_view` (what the app reads of the runner, a protocol).

May import every room below it, never the roof (`runtime/`: the app and the control plane
read the `Runtime` they are handed through `runner_view.RunnerView`); `audio/` and `images/`
import no `lifecycle` either.
"""
