"""What the runner is compared with: FIFO swapping, LRU without batching, Belady's optimum.

- `Fifo`: llama-swap's behaviour before its scheduler rewrite (#612, #823):
  requests are served strictly in arrival order. The head of the queue is
  served if its model is loaded and has a free slot; if its model is not
  loaded, the least recently used models it needs gone are drained and
  stopped, and it is loaded, while everything behind it waits.
- `Lru`: Ollama's: each model serves its own requests as slots free (no
  head-of-line blocking across models); a model keeps its memory until a load
  needs it; loads happen one at a time in the order requests first asked for
  them; the least recently used models go (drained first), and a victim
  takes no more requests once chosen (no batching: what waits for it waits
  for its reload).
- `belady`: offline: on a sequence of model references, evict the model whose
  next reference is furthest in the future (never again counts as furthest).
  With one size for every model this is the minimum number of loads for that
  sequence; with sizes it is the classic heuristic used as the lower bound
  (evict furthest-next-use until the model fits). It ignores time: requests
  are references, served instantly.

`Fifo` and `Lru` run on the same `Machine` as the runner (same memory, loader,
stop and service times); both keep the pinned model forever.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from collections.abc import Sequence

from bench.swap.sim import Policy
from bench.swap.trace import Request, Trace


class _Swapping(Policy):
    """Memory bookkeeping shared by the two baselines: one swap at a time."""

    def __init__(self) -> None:
        self.in_flight: Counter[str] = Counter()
        self.last_used: dict[str, float] = {}
        self.loading: set[str] = set()
        self.closing: set[str] = set()  # victims: no new requests, stop once drained
        self.stopping: set[str] = set()
        self.target: str | None = None  # the model the current swap loads

    def open(self, model: str) -> bool:
        return model in self.m.resident and model not in self.closing

    def in_swap(self, model: str) -> bool:
        """Being loaded, or a victim on its way out (it is asked for again once stopped)."""
        return model == self.target or model in self.loading or model in self.closing

    def begin_swap(self, model: str) -> None:
        """Choose LRU victims until `model` fits (counting loads in progress), then go on."""
        self.target = model
        trace = self.m.trace
        loading_mb = sum(trace.models[x].mem_mb for x in self.loading)
        short = trace.models[model].mem_mb - (self.m.free_mb() - loading_mb)
        candidates = sorted(
            (x for x in self.m.resident if not trace.models[x].pinned and x not in self.closing),
            key=lambda x: self.last_used.get(x, 0.0),
        )
        for victim in candidates:
            if short <= 0:
                break
            self.closing.add(victim)
            short -= trace.models[victim].mem_mb
        self.advance_swap()

    def advance_swap(self) -> None:
        """Stop drained victims; once all are gone, load the target."""
        drained = [v for v in self.closing if not self.in_flight[v] and v not in self.stopping]
        if drained:
            self.stopping.update(drained)
            self.m.stop(sorted(drained))
        target = self.target
        if target is None or self.closing or target in self.loading:
            return
        if target not in self.m.resident:
            self.loading.add(target)
            self.m.load(target)

    def granted(self, req: Request) -> None:
        self.in_flight[req.model] += 1
        self.last_used[req.model] = self.m.now
        self.m.serve(req.rid)

    def on_done(self, req: Request) -> None:
        self.in_flight[req.model] -= 1
        self.last_used[req.model] = self.m.now
        self.advance_swap()
        self.pump()

    def on_ready(self, model: str) -> None:
        self.loading.discard(model)
        self.last_used[model] = self.m.now
        if self.target == model:
            self.target = None
        self.pump()

    def on_stopped(self, model: str) -> None:
        self.closing.discard(model)
        self.stopping.discard(model)
        self.advance_swap()
        self.pump()

    def pump(self) -> None: ...


class Fifo(_Swapping):
    name = "fifo"

    def __init__(self) -> None:
        super().__init__()
        self.queue: deque[Request] = deque()

    def on_arrival(self, req: Request) -> None:
        self.queue.append(req)
        self.pump()

    def pump(self) -> None:
        """Serve the head while it can be served; swap for it when its model is absent."""
        trace = self.m.trace
        while self.queue:
            head = self.queue[0]
            model = head.model
            if self.open(model):
                if self.in_flight[model] >= trace.models[model].concurrency:
                    return
                self.queue.popleft()
                self.granted(head)
                continue
            if self.target is None and model not in self.loading:
                self.begin_swap(model)
            return


class Lru(_Swapping):
    name = "lru"

    def __init__(self) -> None:
        super().__init__()
        self.queues: dict[str, deque[Request]] = defaultdict(deque)
        self.pending: deque[str] = deque()  # models to load, in the order they were asked for

    def on_arrival(self, req: Request) -> None:
        self.queues[req.model].append(req)
        self.pump()

    def pump(self) -> None:
        """Serve every open model's queue; start the next pending load if none is under way."""
        trace = self.m.trace
        for model, queue in self.queues.items():
            if not queue:
                continue
            if self.open(model):
                while queue and self.in_flight[model] < trace.models[model].concurrency:
                    self.granted(queue.popleft())
            elif model not in self.pending and not self.in_swap(model):
                self.pending.append(model)
        while self.target is None and self.pending:
            model = self.pending.popleft()
            if model in self.m.resident or model in self.loading:
                continue
            self.begin_swap(model)


def belady(sequence: Sequence[str], trace: Trace) -> tuple[int, float]:
    """Loads and load seconds of the furthest-next-use policy on `sequence`; pins are kept."""
    models = trace.models
    positions: dict[str, deque[int]] = defaultdict(deque)
    for i, model in enumerate(sequence):
        positions[model].append(i)
    resident: set[str] = set()
    free = trace.capacity_mb
    loads, seconds = 0, 0.0
    never = len(sequence)
    for model in sequence:
        positions[model].popleft()
        if model in resident:
            continue
        need = models[model].mem_mb
        while free < need:
            victim = max(
                (m for m in resident if not models[m].pinned),
                key=lambda m: (positions[m][0] if positions[m] else never, m),
            )
            resident.remove(victim)
            free += models[victim].mem_mb
        resident.add(model)
        free -= need
        loads += 1
        seconds += trace.load_s(model)
    return loads, seconds


def arrival_order(requests: Sequence[Request]) -> list[str]:
    return [r.model for r in requests]
