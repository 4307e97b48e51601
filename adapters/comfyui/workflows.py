"""Workflow templates: a ComfyUI API-format graph with typed `{{parameter}}` placeholders.

A template is what ComfyUI's "Save (API)" exports, with the values a request may change
replaced by placeholders::

    {"name": "txt2img",
     "params": {"width": {"type": "int", "default": 512, "min": 64, "max": 2048,
                          "multiple_of": 8}, ...},
     "graph": {"5": {"class_type": "EmptyLatentImage",
                     "inputs": {"width": "{{width}}", "height": "{{height}}", ...}}, ...}}

A string that is exactly one placeholder takes the parameter's typed value (an int stays an
int); a placeholder inside a longer string is replaced by its text. Rendering (`render`)
checks every value against its declaration first, so a bad request is refused with a 400
naming the parameter before anything reaches ComfyUI. A template is held to ComfyUI's own
input limits when it is loaded (`within_comfyui`, `node_limits.py`): bounds beyond them are
refused, missing ones become them, so what rendering lets through ComfyUI accepts.

Every template must use `{{filename_prefix}}` (each job saves under its own prefix: ComfyUI
serves an identical graph from its cache, and its `executed` event then names the files of
the earlier job). The parameters the images API fills are `prompt`, `width`, `height`,
`batch_size` (`n`), `seed`, `checkpoint` and `filename_prefix`, plus the extensions
`negative_prompt`, `steps` and `cfg` (`x_negative_prompt`, ...) when the template declares
them; a template that does not declare one (the model-free test template has no prompt)
simply does not receive it.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from adapters.comfyui.errors import InvalidWorkflowParameter
from adapters.comfyui.node_limits import COMFYUI_VERSION, MAX_SEED, Limit, known, limit_of
from faults import ConfigError

log = logging.getLogger("quorum.comfyui")

ParamKind = Literal["str", "int", "float"]
Value = str | int | float
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_][a-z0-9_]*)\s*\}\}")
_KINDS: dict[str, ParamKind] = {"str": "str", "string": "str", "int": "int", "float": "float"}


@dataclass(frozen=True, slots=True)
class Param:
    """One typed template parameter; `default` None means the request must give it."""

    kind: ParamKind
    default: Value | None = None
    minimum: float | None = None
    maximum: float | None = None
    multiple_of: int | None = None
    max_length: int | None = None

    def check(self, name: str, value: object) -> Value:
        """`value` converted to this parameter's type, or InvalidWorkflowParameter.

        1. Type: str for str; an int (not a bool) for int; an int or float for float.
        2. Strings: at most `max_length` characters.
        3. Numbers: within [minimum, maximum], and a multiple of `multiple_of`.
        """
        if self.kind == "str":  # 1, 2
            if not isinstance(value, str):
                raise InvalidWorkflowParameter(f"{name} must be a string")
            if self.max_length is not None and len(value) > self.max_length:
                raise InvalidWorkflowParameter(
                    f"{name} is longer than {self.max_length} characters"
                )
            return value
        number: int | float
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidWorkflowParameter(f"{name} must be an integer")
            number = value
        else:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidWorkflowParameter(f"{name} must be a number")
            number = float(value)
        if self.minimum is not None and number < self.minimum:  # 3
            raise InvalidWorkflowParameter(f"{name} must be at least {self.minimum:g}")
        if self.maximum is not None and number > self.maximum:
            raise InvalidWorkflowParameter(f"{name} must be at most {self.maximum:g}")
        if self.multiple_of and isinstance(number, int) and number % self.multiple_of:
            raise InvalidWorkflowParameter(f"{name} must be a multiple of {self.multiple_of}")
        return number


@dataclass(frozen=True)
class WorkflowTemplate:
    name: str
    graph: Mapping[str, Any]
    params: Mapping[str, Param]

    def __post_init__(self) -> None:
        used = placeholders(self.graph)
        undeclared = sorted(used - set(self.params))
        if undeclared:
            raise ConfigError(
                f"workflow {self.name!r} uses undeclared parameter(s): {', '.join(undeclared)}"
            )
        if "filename_prefix" not in used:
            raise ConfigError(
                f"workflow {self.name!r} must save with {{{{filename_prefix}}}} "
                "(each job needs its own prefix)"
            )
        for node_id, node in self.graph.items():
            if not isinstance(node, Mapping) or not isinstance(node.get("class_type"), str):
                raise ConfigError(f"workflow {self.name!r}: node {node_id!r} has no class_type")

    @property
    def node_count(self) -> int:
        return len(self.graph)

    def render(self, values: Mapping[str, object]) -> dict[str, Any]:
        """The graph with every placeholder filled (pure).

        1. A value for a parameter the template does not declare: 400.
        2. Each declared parameter: the given value or its default; none: 400 naming it.
        3. Each value checked against its declaration (`Param.check`): 400 naming it.
        4. Placeholders replaced in a copy of the graph.
        """
        unknown = sorted(set(values) - set(self.params))  # 1
        if unknown:
            raise InvalidWorkflowParameter(
                f"workflow {self.name!r} has no parameter(s) {', '.join(unknown)}"
            )
        filled: dict[str, Value] = {}
        for name, param in self.params.items():  # 2
            value = values.get(name, param.default)
            if value is None:
                raise InvalidWorkflowParameter(f"{name} is required by workflow {self.name!r}")
            filled[name] = param.check(name, value)  # 3
        graph: dict[str, Any] = _substitute(copy.deepcopy(dict(self.graph)), filled)  # 4
        return graph


def placeholders(node: object) -> set[str]:
    """Every parameter name a graph (or any part of it) mentions."""
    if isinstance(node, str):
        return set(_PLACEHOLDER.findall(node))
    if isinstance(node, Mapping):
        return set().union(*(placeholders(v) for v in node.values())) if node else set()
    if isinstance(node, list):
        return set().union(*(placeholders(v) for v in node)) if node else set()
    return set()


def _substitute(node: Any, values: Mapping[str, Value]) -> Any:
    if isinstance(node, str):
        whole = _PLACEHOLDER.fullmatch(node)
        if whole:
            return values[whole.group(1)]
        return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), node)
    if isinstance(node, dict):
        return {k: _substitute(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, values) for v in node]
    return node


def param_from_json(name: str, raw: object) -> Param:
    """A parameter declaration from a template file (`type`, `default`, `min`, `max`, ...)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"parameter {name!r} must be an object")
    kind = _KINDS.get(str(raw.get("type")))
    if kind is None:
        raise ConfigError(f"parameter {name!r}: type must be str, int or float")
    param = Param(
        kind,
        raw.get("default"),
        raw.get("min"),
        raw.get("max"),
        raw.get("multiple_of"),
        raw.get("max_length"),
    )
    if param.default is not None:
        try:
            param.check(name, param.default)
        except InvalidWorkflowParameter as exc:
            raise ConfigError(f"parameter {name!r}: default does not fit: {exc}") from None
    return param


def template_from_json(doc: Mapping[str, Any], source: str = "template") -> WorkflowTemplate:
    graph, params = doc.get("graph"), doc.get("params", {})
    if not isinstance(graph, Mapping) or not graph:
        raise ConfigError(f"{source}: 'graph' must be a non-empty object (API format)")
    if not isinstance(params, Mapping):
        raise ConfigError(f"{source}: 'params' must be an object")
    name = str(doc.get("name", source))
    return WorkflowTemplate(name, graph, {k: param_from_json(k, v) for k, v in params.items()})


Use = tuple[Limit, str]  # a number input a parameter feeds: its limit, where it is


def _uses(template: WorkflowTemplate) -> tuple[dict[str, list[Use]], set[str]]:
    """The number inputs each parameter feeds, and the node classes of unknown limits.

    A literal number on a known input must be within its limit; a placeholder on one must
    be the whole value (ComfyUI converts text with `int()`) of an int or float parameter.
    """
    uses: dict[str, list[Use]] = {}
    unknown: set[str] = set()
    for node_id, node in template.graph.items():
        kind = node["class_type"]
        if not known(kind):
            unknown.add(kind)
            continue
        for name, value in (node.get("inputs") or {}).items():
            limit = limit_of(kind, name)
            if limit is None:
                continue
            where = f"{kind}.{name} (node {node_id})"
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                continue  # a link to another node's output
            if not isinstance(value, str):
                if not limit.minimum <= value <= limit.maximum:
                    raise ConfigError(
                        f"workflow {template.name!r}: {where} is {value:g}, outside ComfyUI "
                        f"{COMFYUI_VERSION}'s {limit.minimum:g}..{limit.maximum:g}"
                    )
                continue
            whole = _PLACEHOLDER.fullmatch(value)
            if whole is None:
                if placeholders(value):
                    raise ConfigError(
                        f"workflow {template.name!r}: {where} takes a number, so its "
                        "placeholder must be the whole value"
                    )
                continue
            param = whole.group(1)
            if template.params[param].kind == "str":
                raise ConfigError(
                    f"workflow {template.name!r}: parameter {param!r} is text but feeds "
                    f"{where}, a number"
                )
            uses.setdefault(param, []).append((limit, where))
    return uses, unknown


def within_comfyui(template: WorkflowTemplate) -> WorkflowTemplate:
    """`template` held to ComfyUI's input limits (`node_limits.py`; pure but for a log line).

    1. The number inputs each parameter feeds (`_uses`; literal values checked there).
    2. A declared bound beyond the tightest limit among them: ConfigError naming the
       parameter, the node input and ComfyUI's limit.
    3. An undeclared bound becomes that limit; the default must fit what results.
    Node classes whose limits the runner does not know keep the template's bounds (logged).
    """
    uses, unknown = _uses(template)  # 1
    params = dict(template.params)
    for name, fed in uses.items():
        param = params[name]
        low, low_at = max((limit.minimum, where) for limit, where in fed)
        high, high_at = min((limit.maximum, where) for limit, where in fed)
        beyond = (  # 2
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
        params[name] = dataclasses.replace(  # 3
            param,
            minimum=low if param.minimum is None else param.minimum,
            maximum=high if param.maximum is None else param.maximum,
        )
        if param.default is not None:
            try:
                params[name].check(name, param.default)
            except InvalidWorkflowParameter as exc:
                raise ConfigError(f"workflow {template.name!r}: default of {exc}") from None
    if unknown:
        names = ", ".join(sorted(unknown))
        log.info("workflow %r: ComfyUI's limits of %s unknown here", template.name, names)
    if params == dict(template.params):
        return template
    return WorkflowTemplate(template.name, template.graph, params)


def load_template(name_or_path: str) -> WorkflowTemplate:
    """A built-in template by name (`txt2img`, `model-free-test`), or a JSON template file;
    either held to ComfyUI's input limits (`within_comfyui`)."""
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


_SIZE = {"minimum": 64, "maximum": 2048, "multiple_of": 8}

TXT2IMG = WorkflowTemplate(
    "txt2img",
    {
        "3": {
            "class_type": "KSampler",
            "inputs": {
                "seed": "{{seed}}",
                "steps": "{{steps}}",
                "cfg": "{{cfg}}",
                "sampler_name": "euler",
                "scheduler": "normal",
                "denoise": 1.0,
                "model": ["4", 0],
                "positive": ["6", 0],
                "negative": ["7", 0],
                "latent_image": ["5", 0],
            },
        },
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "{{checkpoint}}"}},
        "5": {
            "class_type": "EmptyLatentImage",
            "inputs": {
                "width": "{{width}}",
                "height": "{{height}}",
                "batch_size": "{{batch_size}}",
            },
        },
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{prompt}}", "clip": ["4", 1]}},
        "7": {
            "class_type": "CLIPTextEncode",
            "inputs": {"text": "{{negative_prompt}}", "clip": ["4", 1]},
        },
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {
            "class_type": "SaveImage",
            "inputs": {"filename_prefix": "{{filename_prefix}}", "images": ["8", 0]},
        },
    },
    {
        "prompt": Param("str", max_length=32000),
        "negative_prompt": Param("str", "", max_length=32000),
        "width": Param("int", 512, **_SIZE),
        "height": Param("int", 512, **_SIZE),
        "batch_size": Param("int", 1, 1, 8),
        "seed": Param("int", 0, 0, MAX_SEED),
        "steps": Param("int", 20, 1, 150),
        "cfg": Param("float", 8.0, 0.0, 30.0),
        "checkpoint": Param("str"),
        "filename_prefix": Param("str", max_length=200),
    },
)
"""ComfyUI's default text-to-image graph (CheckpointLoaderSimple -> CLIPTextEncode x2 ->
EmptyLatentImage -> KSampler -> VAEDecode -> SaveImage), inputs as in `nodes.py`."""

MODEL_FREE_TEST = WorkflowTemplate(
    "model-free-test",
    {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {
                "width": "{{width}}",
                "height": "{{height}}",
                "batch_size": "{{batch_size}}",
                "color": "{{color}}",
            },
        },
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {
            "class_type": "SaveImage",
            "inputs": {"filename_prefix": "{{filename_prefix}}", "images": ["2", 0]},
        },
    },
    {
        "width": Param("int", 64, 1, 4096),
        "height": Param("int", 64, 1, 4096),
        "batch_size": Param("int", 1, 1, 8),
        "color": Param("int", 0, 0, 0xFFFFFF),
        "filename_prefix": Param("str", max_length=200),
    },
)
"""EmptyImage -> ImageInvert -> SaveImage: runs on CPU in milliseconds, needs no model
(ENGINES.md); the warm-up and smoke test of a ComfyUI with no checkpoint."""

BUILTIN: dict[str, WorkflowTemplate] = {t.name: t for t in (TXT2IMG, MODEL_FREE_TEST)}
