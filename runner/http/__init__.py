"""HTTP: everything that speaks to a client.

`app.RunnerApp` (the ASGI app and its lifespan), `server` (uvicorn, SIGTERM), `limits`
and `coalesce` (what one connection may cost, one write per answer), `uvicorn_seam` (the
only import of uvicorn's private protocol; refuses an untested uvicorn), `headers` (request
headers, pure), `frontend.FrontEnd` (the one request front-end: identify, rate limit,
bounded body, admission), `chat` and `body_checks` (the text inference path),
`control_plane` (FastAPI routes: health, capabilities, lifecycle, jobs, logs),
`status_page` (`/ui`), `openapi/` (the OpenAPI document), `ui/` (the page's files),
`traced` (the server span and the engine call's span, tracing on).

May import every other room of the runner; nothing below imports `runner.http`, except
that `audio/` and `images/` plug their paths into the front-end and ASGI types here.
"""
