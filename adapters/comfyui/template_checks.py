"""Loading a workflow template, held to the pinned ComfyUI's input specs (`node_limits.py`).

ComfyUI's `POST /prompt` (`execution.py` `validate_inputs`) converts each input to its
declared type, then refuses a number below `min` or above `max` and a value of a fixed-choice
input that is not in its list, with a 400 before it queues the prompt. The runner checks
the same before it accepts a request: a template's parameters take on the bounds and
choices of every input they feed when it is loaded, so rendering refuses (400 naming the
parameter) what ComfyUI would, before a 202. The seed the runner draws for a request
without `x_seed` is drawn within the same bounds (`seed_range`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from adapters.comfyui.errors import InvalidWorkflowParameter
from adapters.comfyui.node_limits import (
    COMFYUI_VERSION,
    MAX_SEED,
    Limit,
    choices_of,
    known,
    limit_of,
)
from adapters.comfyui.workflows import (
    BUILTIN,
    PLACEHOLDER,
    Param,
    WorkflowTemplate,
    placeholders,
    template_from_json,
)
from faults import ConfigError

log = logging.getLogger("quorum.comfyui")

Where = str  # "KSampler.seed (node 3)"


@dataclass
class _Uses:
    """What each parameter feeds: number inputs (their limits) and fixed-choice inputs."""

    numbers: dict[str, list[tuple[Limit, Where]]] = field(default_factory=dict)
    choices: dict[str, list[tuple[tuple[str, ...], Where]]] = field(default_factory=dict)
    unknown: set[str] = field(default_factory=set)


def _check_literal(
    template: WorkflowTemplate, where: Where, value: object, limit: Limit | None, choices: Any
) -> None:
    """A value the graph fixes must be one ComfyUI accepts (else every request fails)."""
    if (
        limit is not None
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and not limit.minimum <= value <= limit.maximum
    ):
        raise ConfigError(
            f"workflow {template.name!r}: {where} is {value:g}, outside ComfyUI "
            f"{COMFYUI_VERSION}'s {limit.minimum:g}..{limit.maximum:g}"
        )
    if choices is not None and isinstance(value, str) and value not in choices:
        raise ConfigError(
            f"workflow {template.name!r}: {where} is {value!r}, not one of ComfyUI "
            f"{COMFYUI_VERSION}'s choices ({', '.join(choices)})"
        )


def _uses(template: WorkflowTemplate) -> _Uses:
    """The inputs each parameter feeds, and the node classes of unknown specs.

    A literal on a known input must be one ComfyUI accepts; a placeholder on a number or
    fixed-choice input must be the whole value (ComfyUI converts text with `int()`, and
    compares a choice whole) of a parameter of the input's kind.
    """
    uses = _Uses()
    for node_id, node in template.graph.items():
        kind = node["class_type"]
        if not known(kind):
            uses.unknown.add(kind)
            continue
        for name, value in (node.get("inputs") or {}).items():
            limit, choices = limit_of(kind, name), choices_of(kind, name)
            if limit is None and choices is None:
                continue
            where = f"{kind}.{name} (node {node_id})"
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                continue  # a link to another node's output
            whole = PLACEHOLDER.fullmatch(value) if isinstance(value, str) else None
            if whole is None:
                if isinstance(value, str) and placeholders(value):
                    what = "a number" if limit is not None else "one of fixed choices"
                    raise ConfigError(
                        f"workflow {template.name!r}: {where} takes {what}, so its "
                        "placeholder must be the whole value"
                    )
                _check_literal(template, where, value, limit, choices)
                continue
            param = whole.group(1)
            text = template.params[param].kind == "str"
            if limit is not None and text:
                raise ConfigError(
                    f"workflow {template.name!r}: parameter {param!r} is text but feeds "
                    f"{where}, a number"
                )
            if choices is not None and not text:
                raise ConfigError(
                    f"workflow {template.name!r}: parameter {param!r} is a number but "
                    f"feeds {where}, a fixed choice of text"
                )
            if limit is not None:
                uses.numbers.setdefault(param, []).append((limit, where))
            if choices is not None:
                uses.choices.setdefault(param, []).append((choices, where))
    return uses


def _bounded(template: WorkflowTemplate, name: str, fed: list[tuple[Limit, Where]]) -> Param:
    """Parameter `name` within the tightest of the limits it feeds (steps 2-3 below)."""
    param = template.params[name]
    low, low_at = max((limit.minimum, where) for limit, where in fed)
    high, high_at = min((limit.maximum, where) for limit, where in fed)
    beyond = (
        f"at least {param.minimum:g}, but {low_at} must be at least {low:g}"
        if param.minimum is not None and param.minimum < low
        else f"up to {param.maximum:g}, but {high_at} must be at most {high:g}"
        if param.maximum is not None and param.maximum > high
        else None
    )
    if beyond is not None:
        raise ConfigError(
            f"workflow {template.name!r}: parameter {name!r} allows {beyond} "
            f"(ComfyUI {COMFYUI_VERSION})"
        )
    return dataclasses.replace(
        param,
        minimum=low if param.minimum is None else param.minimum,
        maximum=high if param.maximum is None else param.maximum,
    )


def within_comfyui(template: WorkflowTemplate) -> WorkflowTemplate:
    """`template` held to ComfyUI's input specs (`node_limits.py`; pure but for a log line).

    1. The inputs each parameter feeds (`_uses`; literal values checked there).
    2. A declared bound beyond the tightest limit among the number inputs it feeds:
       ConfigError naming the parameter, the node input and ComfyUI's limit.
    3. An undeclared bound becomes that limit.
    4. A text feeding fixed-choice inputs may take only the choices all of them accept
       (none in common: ConfigError).
    5. The default must fit what results.
    Node classes whose specs the runner does not know keep the template's bounds (logged).
    """
    uses = _uses(template)  # 1
    params = dict(template.params)
    for name, fed in uses.numbers.items():  # 2, 3
        params[name] = _bounded(template, name, fed)
    for name, lists in uses.choices.items():  # 4
        common = [c for c in lists[0][0] if all(c in other for other, _ in lists)]
        if not common:
            places = ", ".join(where for _, where in lists)
            raise ConfigError(
                f"workflow {template.name!r}: parameter {name!r} feeds {places}, "
                "which have no choice in common"
            )
        params[name] = dataclasses.replace(params[name], choices=tuple(common))
    for name, param in params.items():  # 5
        if param.default is not None and param != template.params[name]:
            try:
                param.check(name, param.default)
            except InvalidWorkflowParameter as exc:
                raise ConfigError(f"workflow {template.name!r}: default of {exc}") from None
    if uses.unknown:
        names = ", ".join(sorted(uses.unknown))
        log.info("workflow %r: ComfyUI's limits of %s unknown here", template.name, names)
    if params == dict(template.params):
        return template
    return WorkflowTemplate(template.name, template.graph, params)


SEED_DRAW_MAX = (1 << 63) - 1
"""The largest seed drawn for a template that bounds its seed nowhere (a custom node)."""


def seed_range(template: WorkflowTemplate) -> tuple[int, int] | None:
    """The seeds a request without `x_seed` is drawn from: the template's `seed` bounds
    (the tightest of every input it feeds, `within_comfyui`), else 0..2^63-1; None when
    the template takes no seed (pure)."""
    param: Param | None = template.params.get("seed")
    if param is None:
        return None
    low = max(int(param.minimum), 0) if param.minimum is not None else 0
    high = min(int(param.maximum), MAX_SEED) if param.maximum is not None else SEED_DRAW_MAX
    return low, max(high, low)


def load_template(name_or_path: str) -> WorkflowTemplate:
    """A built-in template by name (`txt2img`, `model-free-test`), or a JSON template file;
    either held to ComfyUI's input specs (`within_comfyui`)."""
    builtin = BUILTIN.get(name_or_path)
    if builtin is not None:
        return within_comfyui(builtin)
    path = Path(name_or_path)
    try:
        doc = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"workflow {name_or_path!r}: cannot read: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"workflow {name_or_path!r}: not JSON: {exc}") from None
    if not isinstance(doc, Mapping):
        raise ConfigError(f"workflow {name_or_path!r}: must be a JSON object")
    return within_comfyui(template_from_json(doc, name_or_path))
