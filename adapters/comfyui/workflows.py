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
input limits when it is loaded (`template_checks.py`, `node_limits.py`): bounds beyond them
are refused, missing ones become them, and a text feeding a fixed-choice input must be one
of its choices, so what rendering lets through ComfyUI accepts.

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
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from adapters.comfyui.errors import InvalidWorkflowParameter
from adapters.comfyui.node_limits import MAX_SEED
from faults import ConfigError

ParamKind = Literal["str", "int", "float"]
Value = str | int | float
PLACEHOLDER = re.compile(r"\{\{\s*([a-z_][a-z0-9_]*)\s*\}\}")
_KINDS: dict[str, ParamKind] = {"str": "str", "string": "str", "int": "int", "float": "float"}


def number_text(value: float) -> str:
    """A bound as a client reads it: whole numbers in full (16777215, not 1.67772e+07)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True, slots=True)
class Param:
    """One typed template parameter; `default` None means the request must give it."""

    kind: ParamKind
    default: Value | None = None
    minimum: float | None = None
    maximum: float | None = None
    multiple_of: int | None = None
    max_length: int | None = None
    choices: tuple[str, ...] | None = None

    def check(self, name: str, value: object) -> Value:
        """`value` converted to this parameter's type, or InvalidWorkflowParameter.

        1. Type: str for str; an int (not a bool) for int; an int or float for float.
        2. Strings: at most `max_length` characters, and one of `choices` when it feeds a
           fixed-choice input (`template_checks.within_comfyui`).
        3. Numbers: within [minimum, maximum], and a multiple of `multiple_of`.
        """
        if self.kind == "str":  # 1, 2
            if not isinstance(value, str):
                raise InvalidWorkflowParameter(f"{name} must be a string")
            if self.max_length is not None and len(value) > self.max_length:
                raise InvalidWorkflowParameter(
                    f"{name} is longer than {self.max_length} characters"
                )
            if self.choices is not None and value not in self.choices:
                listed = ", ".join(repr(c) for c in self.choices[:20])
                more = ", ..." if len(self.choices) > 20 else ""
                raise InvalidWorkflowParameter(f"{name} must be one of {listed}{more}")
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
            raise InvalidWorkflowParameter(f"{name} must be at least {number_text(self.minimum)}")
        if self.maximum is not None and number > self.maximum:
            raise InvalidWorkflowParameter(f"{name} must be at most {number_text(self.maximum)}")
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
            self._text_after_the_prefix(node_id, (node.get("inputs") or {}).get(FILE_NAME_INPUT))

    def _text_after_the_prefix(self, node_id: str, prefix: object) -> None:
        """A text parameter in a file name comes after `{{filename_prefix}}` (inside the
        job's own folder, removed with it), never before it (a folder named after a
        request's text, left in ComfyUI's output folder)."""
        if not isinstance(prefix, str) or "{{" not in prefix:
            return
        names = [m.group(1) for m in PLACEHOLDER.finditer(prefix)]
        first = names.index(FILE_NAME_INPUT) if FILE_NAME_INPUT in names else len(names)
        early = [n for n in names[:first] if n in self.params and self.params[n].kind == "str"]
        if early:
            raise ConfigError(
                f"workflow {self.name!r}: node {node_id!r} puts {{{{{early[0]}}}}} before "
                "{{filename_prefix}} in its file name, so a request's text would name a "
                "folder outside the job's own"
            )

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
        return set(PLACEHOLDER.findall(node))
    if isinstance(node, Mapping):
        return set().union(*(placeholders(v) for v in node.values())) if node else set()
    if isinstance(node, list):
        return set().union(*(placeholders(v) for v in node)) if node else set()
    return set()


def _substitute(node: Any, values: Mapping[str, Value]) -> Any:
    if isinstance(node, str):
        whole = PLACEHOLDER.fullmatch(node)
        if whole:
            return values[whole.group(1)]
        return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), node)
    if isinstance(node, dict):
        return {
            k: _in_file_name(v, values)
            if k == FILE_NAME_INPUT and isinstance(v, str)
            else _substitute(v, values)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_substitute(v, values) for v in node]
    return node


FILE_NAME_INPUT = "filename_prefix"
"""The input ComfyUI's save nodes build a file's path from (SaveImage and the others)."""
FILE_NAME_PART_MAX = 48
_UNSAFE_IN_NAME = re.compile(r"[/\\%\x00-\x1f]|\.\.+")


def path_safe(text: str) -> str:
    """`text` as one part of a file name (pure): no folder separator, no ComfyUI `%var%`,
    no control character, no `..` (ComfyUI's `/view` refuses a name holding one; each
    becomes `_`), at most FILE_NAME_PART_MAX characters, so a request's text never names
    a folder or leaves the job's own."""
    return _UNSAFE_IN_NAME.sub("_", text)[:FILE_NAME_PART_MAX]


def _in_file_name(node: str, values: Mapping[str, Value]) -> str:
    """A `filename_prefix` input: the job's own prefix as it is, every other value made
    `path_safe` (a template may put the prompt into the file name, never into a folder)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        value = str(values[name])
        return value if name == FILE_NAME_INPUT else path_safe(value)

    return PLACEHOLDER.sub(one, node)


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


_SIZE: dict[str, Any] = {"minimum": 64, "maximum": 2048, "multiple_of": 8}

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
