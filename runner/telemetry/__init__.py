"""What the runner tells about itself: metrics, health, capabilities, status.

`metrics` (the registries and the request path's series), `exposition` and `series` (the
cheap Prometheus writer and series), `picker_metrics` (the endpoint picker's `vllm:*` view),
`seed_metrics` (the seed's names), `state_metrics` (families read at scrape time: health,
the engines' queues, the wait forecasts), `outcome_metrics` (how things ended),
`metrics_port` (METRICS_PORT), `health` (what `/health` answers, pure), `capabilities` (the
capabilities document, pure), `snapshot` (the 5 s resource snapshot), `status_view` (what
the status page shows, pure), `tracing` (OpenTelemetry traces from OTEL_*: off unless
asked), `traced_requests` (admission, token budgets and the request's tenant and model
on its spans).

Reads the engines, the scheduler, memory, tenancy and the floor; never imports a request
path (`http/`, `audio/`, `images/`), `lifecycle/` or `jobs/` (contracts in pyproject.toml).
"""
