"""An OpenAI-compatible engine the runner did not start, attached by URL (`backend: openai`).

`engine.AttachedOpenAIEngine` forwards requests; `kind.OpenAIKind` is the engine kind
(`kind.attach_openai` also serves an attached llama-server, which adds what it can tell).
Any server with OpenAI's `/v1/chat/completions`, `/v1/completions` or `/v1/embeddings`
fits: LM Studio, Ollama's `/v1`, TGI's Messages API, SGLang, vLLM or llama-server run by
someone else (their own kinds know more of them: `backend: vllm` / `llama-server` with a
`url`), another Quorum. What the runner can and cannot know of an engine it did not start:

- **Slots.** Unknown: the runner never sends more than the model's `parallel` (default 8)
  at once, and queues, orders and refuses the rest itself, fairly across tenants. The
  engine's own limit (Ollama's `OLLAMA_NUM_PARALLEL`, TGI's `--max-concurrent-requests`,
  SGLang's running batch, another Quorum's queue) is its own: above it requests wait
  inside the engine, out of the runner's sight (counted in `X-GPU-Time-Ms`, not in
  `X-Queue-Wait-Ms`). Set `parallel` to the engine's limit.
- **Cache reports.** What the answer carries, nothing more: OpenAI's
  `usage.prompt_tokens_details.cached_tokens`, or llama.cpp's `timings` (`cache_n`,
  `prompt_ms`, `predicted_ms`) when present. An engine that reports neither answers
  `X-Cache-Hit: false` and `X-GPU-Time-Ms: 0` whatever it reused; a stream's headers
  never carry a figure (no first-chunk report).
- **Isolation.** None the runner can enforce: it cannot salt, pin or erase the engine's
  prefix cache, so one tenant's prompt may warm another's. With ENABLE_MULTI_TENANT the
  runner warns at start-up unless the model is marked `single_tenant` or `shared_cache`;
  capabilities never claim prefix caching for it; a flush answers `flushed: false`.
  Requests go without the client's `Authorization` (the runner's connection carries no
  credentials: an engine that requires an API key cannot be attached), so an upstream
  Quorum sees one anonymous client and applies its default tenant's limits to all of them.
- **Health.** Only whether it answers: `GET /v1/models` every ENGINE_STATS_INTERVAL_S,
  any HTTP answer within ENGINE_PROBE_TIMEOUT_S counts (runner/engines/watch.py). After
  ENGINE_PROBE_MISSES missed probes the model fails (requests on it 502
  `engine_crashed`, new ones 503 `model_unavailable`) and comes back once it answers
  again. There is no process to watch: a crash is seen at the probes, not at once, and
  an engine that answers its probe but never finishes a request is seen only by each
  request's ENGINE_READ_TIMEOUT_S (504 `engine_timeout`). It is never restarted, stopped,
  put to sleep or evicted (pinned, holding none of the runner's memory), and it has no
  logs here.
- **Version.** Unknown: `runnerType` names the kind alone (`openai`).
- **Metrics.** None read: its own `/metrics` (if any) is not scraped, so capabilities'
  KV cache figures and `queue.running` leave it out, and its memory is not the runner's.
"""
