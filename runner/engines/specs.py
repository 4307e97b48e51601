"""The catalog of models this runner knows: their specs, what their next start asks for, and
the policy the scheduler treats each by.

The models file's entries are known from the start; a governed load adds (or replaces)
the spec it resolved, with the load's parameters (`register`). The engines themselves are
the pool's (`pool.ModelPool`), which starts a model from what is here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from adapters.fields import RequestFields
from adapters.kind import EngineKind
from runner.engines.kinds import EngineKinds, LoadParams
from runner.engines.sizing import policy_for
from runner.floor.models_file import ModelSpec
from runner.scheduler.config import ModelPolicy

GpuTotal = Callable[[Sequence[int] | None], int | None]
"""The total memory of the first of some GPUs (None: the first visible); None when unknown."""


class ModelSpecs:
    def __init__(self, models: Sequence[ModelSpec], kinds: EngineKinds, gpu_total: GpuTotal):
        self.kinds = kinds
        self.gpu_total = gpu_total
        self._specs: dict[str, ModelSpec] = {m.id: m for m in models}
        self._params: dict[str, LoadParams] = {}
        self._fields: dict[str, RequestFields] = {}

    def spec(self, model: str) -> ModelSpec | None:
        return self._specs.get(model)

    def specs(self) -> dict[str, ModelSpec]:
        return dict(self._specs)

    def params(self, model: str) -> LoadParams:
        """What the model's next start asks for beyond its spec."""
        return self._params.get(model, LoadParams())

    def kind(self, spec: ModelSpec) -> EngineKind:
        return self.kinds.of(spec)

    def request_path(self, model: str) -> str | None:
        """The request path that serves `model` (its kind's); None: not a model here."""
        spec = self._specs.get(model)
        return self.kinds.of(spec).traits.request_path if spec is not None else None

    def request_fields(self, model: str) -> RequestFields | None:
        """The request fields `model` takes beyond OpenAI's: its kind's, with its
        `pass_through` (worked out once per spec); None: not a model here."""
        fields = self._fields.get(model)
        if fields is not None:
            return fields
        spec = self._specs.get(model)
        if spec is None:
            return None
        fields = self.kinds.of(spec).traits.request_fields.with_passed(spec.pass_through)
        self._fields[model] = fields
        return fields

    def register(self, spec: ModelSpec, params: LoadParams | None = None) -> None:
        """Know `spec` (a governed load resolved it), and what its next start asks for."""
        self._specs[spec.id] = spec
        self._fields.pop(spec.id, None)
        if params is not None:
            self._params[spec.id] = params

    def policy(self, spec: ModelSpec, budget_mb: int | None = None) -> ModelPolicy:
        """How the scheduler treats `spec` (`sizing.policy_for`); a kind that takes a share
        of its GPU whatever its weights weigh is sized by that GPU's total."""
        kind = self.kinds.of(spec)
        share = kind.memory_share(self.kinds.engine_spec(spec))
        wants_total = share is not None and budget_mb is None
        total = self.gpu_total(spec.gpus) if wants_total else None
        return policy_for(spec, self.kinds, budget_mb, total)
