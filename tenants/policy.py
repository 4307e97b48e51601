"""A tenant's policy beyond its rate: entitlements, priority ceiling, in-flight cap, token
budgets (pure parsing and pure decisions; the tenants file and `PUT /v1/tenants/{id}`
share the schema).

```yaml
models: ["gemma-*", "smollm2"]     # ids or glob patterns; absent: every model
priority: {default: normal, max: normal}
max_in_flight: 2                   # requests at the engines at once, all replicas
token_budgets:
  - {tokens: 100000, per: hour}                         # count: total (default)
  - {tokens: 20000, per: minute, count: output, model: "gemma-*"}
```
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase, translate

from tenants.errors import InvalidTenantConfig

PRIORITIES = ("low", "normal", "high")
"""The priority bands, least important first (X-Priority's values)."""
PERIODS = ("minute", "hour", "day", "month")
COUNTS = ("total", "input", "output")
MAX_BUDGETS = 16
MAX_MODEL_PATTERNS = 256
_GLOB = re.compile(r"[A-Za-z0-9._:/*?\[\]!@+-]{1,256}")
_GLOB_CHARS = re.compile(r"[*?\[]")
"""What makes a pattern a glob for `fnmatchcase` (else it matches only itself)."""


@dataclass(frozen=True, slots=True)
class TokenBudget:
    """`tokens` per fixed UTC `per` window (minute, hour, day, calendar month), counting
    `count` tokens (input, output or both) of the models `model` matches (None: all)."""

    tokens: int
    per: str
    model: str | None = None
    count: str = "total"

    def applies_to(self, model: str) -> bool:
        return self.model is None or fnmatchcase(model, self.model)

    def amount(self, input_tokens: int, output_tokens: int) -> int:
        """What a request of these tokens costs against this budget."""
        if self.count == "input":
            return input_tokens
        if self.count == "output":
            return output_tokens
        return input_tokens + output_tokens

    @property
    def key(self) -> str:
        """The budget's identity, without its amount: a policy change that raises or lowers
        `tokens` keeps the window it has already used."""
        return f"{self.per}:{self.count}:{self.model or '*'}"

    @property
    def text(self) -> str:
        """`2000 tokens per minute (total)`, `500 output tokens per hour of gemma-*`."""
        kind = "" if self.count == "total" else f"{self.count} "
        of = f" of {self.model}" if self.model is not None else ""
        return f"{self.tokens} {kind}tokens per {self.per}{of}"

    def to_json(self) -> dict[str, object]:
        return {"tokens": self.tokens, "per": self.per, "model": self.model, "count": self.count}


@dataclass(frozen=True, slots=True)
class Entitlements:
    """The models a tenant may use: exact ids and glob patterns (None: every model).

    Compiled once, when the policy is built: the ids a pattern names exactly as a set, the
    globs as one expression (`fnmatch.translate` of each, alternated), so a check is a set
    lookup and at most one match, however long the list (`fnmatchcase` of any, exactly)."""

    patterns: tuple[str, ...] | None = None
    _exact: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)
    _globs: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.patterns is None:
            return
        globs = [p for p in self.patterns if _GLOB_CHARS.search(p)]
        object.__setattr__(self, "_exact", frozenset(self.patterns))
        if globs:
            compiled = re.compile("|".join(f"(?:{translate(p)})" for p in globs))
            object.__setattr__(self, "_globs", compiled)

    def allows(self, model: str) -> bool:
        if self.patterns is None or model in self._exact:
            return True
        return self._globs is not None and self._globs.match(model) is not None

    def filter(self, models: Sequence[str]) -> list[str]:
        return list(models) if self.patterns is None else [m for m in models if self.allows(m)]


EVERY_MODEL = Entitlements()
"""No `models` list: every model."""


def effective_priority(asked: str | None, default: str, ceiling: str) -> str:
    """The band a request is served at.

    1. Not asked (no X-Priority, no gateway objective): the tenant's `default`.
    2. Asked above the tenant's `max`: `max`.
    3. Otherwise what was asked.
    """
    wanted = default if asked is None else asked  # 1
    if PRIORITIES.index(wanted) > PRIORITIES.index(ceiling):  # 2
        return ceiling
    return wanted  # 3


def parse_models(raw: object, where: str) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) > MAX_MODEL_PATTERNS:
        raise InvalidTenantConfig(
            f"{where}.models: must be a list of at most {MAX_MODEL_PATTERNS} ids or globs"
        )
    for item in raw:
        if not isinstance(item, str) or not _GLOB.fullmatch(item):
            raise InvalidTenantConfig(f"{where}.models: {item!r} is not a model id or glob")
    return tuple(raw)


def parse_priority(raw: object, where: str, default: tuple[str, str]) -> tuple[str, str]:
    """`{default, max}` -> (default, max); a missing half is the inherited one."""
    if raw is None:
        return default
    if not isinstance(raw, dict) or set(raw) - {"default", "max"}:
        raise InvalidTenantConfig(f"{where}.priority: must be a mapping of default and max")
    asked, ceiling = raw.get("default", default[0]), raw.get("max", default[1])
    for name, value in (("default", asked), ("max", ceiling)):
        if value not in PRIORITIES:
            raise InvalidTenantConfig(
                f"{where}.priority.{name}: must be one of low, normal, high, got {value!r}"
            )
    if PRIORITIES.index(asked) > PRIORITIES.index(ceiling):
        raise InvalidTenantConfig(f"{where}.priority: default {asked} is above max {ceiling}")
    return asked, ceiling


def parse_in_flight(raw: object, where: str) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 1_000_000:
        raise InvalidTenantConfig(f"{where}.max_in_flight: must be an integer >= 1, got {raw!r}")
    return raw


def parse_budgets(raw: object, where: str) -> tuple[TokenBudget, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_BUDGETS:
        raise InvalidTenantConfig(
            f"{where}.token_budgets: must be a list of at most {MAX_BUDGETS} budgets"
        )
    budgets: list[TokenBudget] = []
    for i, item in enumerate(raw):
        at = f"{where}.token_budgets[{i}]"
        if not isinstance(item, dict):
            raise InvalidTenantConfig(f"{at}: must be a mapping of tokens, per, model, count")
        unknown = sorted(str(k) for k in set(item) - {"tokens", "per", "model", "count"})
        if unknown:
            raise InvalidTenantConfig(f"{at}: unknown key(s) {', '.join(unknown)}")
        tokens, per = item.get("tokens"), item.get("per")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens < 2**53:
            raise InvalidTenantConfig(f"{at}.tokens: must be an integer >= 1, got {tokens!r}")
        if per not in PERIODS:
            raise InvalidTenantConfig(f"{at}.per: must be one of {', '.join(PERIODS)}")
        count = item.get("count", "total")
        if count not in COUNTS:
            raise InvalidTenantConfig(f"{at}.count: must be one of {', '.join(COUNTS)}")
        model = item.get("model")
        if model is not None and (not isinstance(model, str) or not _GLOB.fullmatch(model)):
            raise InvalidTenantConfig(f"{at}.model: {model!r} is not a model id or glob")
        budget = TokenBudget(tokens, per, model, count)
        if any(b.key == budget.key for b in budgets):
            raise InvalidTenantConfig(
                f"{at}: a budget per {per} of {count} tokens of this model is already listed"
            )
        budgets.append(budget)
    return tuple(budgets)
