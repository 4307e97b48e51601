"""What the runner tells about itself: metrics, health, capabilities, status.

`metrics` (the registries and the request path's series), `exposition` and `histogram`
(the cheap Prometheus writer), `picker_metrics` (the endpoint picker's `vllm:*` view),
`seed_metrics` (the seed's names), `state_metrics`, `outcome_metrics`, `forecast_metrics`
(families read at scrape time), `metrics_port` (METRICS_PORT), `health` (what `/health`
answers, pure), `capabilities` (the capabilities document, pure), `snapshot` (the 5 s
resource snapshot), `status_view` (what the status page shows, pure).

Reads the engines, the scheduler and memory; never imports `http/` or `lifecycle/`.
"""
