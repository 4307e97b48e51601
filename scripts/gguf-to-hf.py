"""Convert a GGUF checkpoint into a Hugging Face folder vLLM can serve (scripts/install-vllm).

vLLM 0.32's CPU build has no GGUF loader (`--model x.gguf` fails: "not a valid JSON file"),
so the default Gemma 3 270M GGUF is dequantized by transformers (its `gguf_file=` loader,
with the `gguf` package) into bf16 safetensors, once. The tokenizer transformers builds
from a GGUF adds no `<bos>` and carries no chat template; both are put back here:

- `<bos>` in front of every encoded text (the tokenizer's post-processor), as Gemma's
  own tokenizer does; without it the model's completions degrade;
- `eos_token_id: [1, 106]` (`<eos>`, `<end_of_turn>`) in generation_config.json, so a
  chat answer stops at the end of the model's turn;
- Gemma's chat template (vLLM refuses chat with 400 "default chat template is no longer
  allowed" without one). It writes `<bos>` itself: vLLM encodes a rendered chat without
  special tokens.

Usage: python gguf-to-hf.py MODEL.gguf OUT_DIR   (run by the vLLM venv's interpreter)

Its progress goes to the file descriptor QUORUM_PROGRESS_FD names, else to stderr
(scripts/install-vllm keeps the libraries' own output in a log and gives it the terminal):
each phase weighs its measured share of a conversion on two cores, and the
de-quantization moves with each tensor.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from progress import Progress, Steps

PHASES = [
    ("loading torch and transformers", 8.0),
    ("reading the tokenizer", 28.0),
    ("reading the model's metadata", 45.0),
    ("de-quantizing the weights", 12.0),
    ("writing bf16 safetensors", 5.0),
    ("writing the tokenizer", 2.0),
]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def convert(gguf: Path, out: Path, steps: Steps) -> None:
    steps.start("loading torch and transformers")
    import torch
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers.utils import logging

    logging.disable_progress_bar()
    gguf_utils.tqdm = _tracked(steps)  # its loop over the GGUF's tensors reports to us

    steps.start("reading the tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    steps.start("reading the model's metadata")
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
    )
    # Dequantized, the weights are plain tensors: what is saved is an ordinary bf16 model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    steps.start("writing bf16 safetensors")
    model.save_pretrained(out)
    steps.start("writing the tokenizer")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    _bos_in_front(out / "tokenizer.json", tokenizer.bos_token, tokenizer.bos_token_id)
    generation = out / "generation_config.json"
    config = json.loads(generation.read_text()) if generation.exists() else {}
    config["eos_token_id"] = [1, 106]
    config.setdefault("bos_token_id", tokenizer.bos_token_id)
    generation.write_text(json.dumps(config, indent=2) + "\n")


def _tracked(steps: Steps) -> Any:
    """A stand-in for tqdm over the GGUF's tensors: the de-quantizing phase, each tensor
    moving it."""

    def tracked(iterable: Iterable[Any], *_: Any, **__: Any) -> Iterator[Any]:
        steps.start("de-quantizing the weights")
        items = list(iterable)
        for i, item in enumerate(items):
            steps.within(i / max(len(items), 1))
            yield item

    return tracked


def _progress_stream() -> IO[str]:
    fd = os.environ.get("QUORUM_PROGRESS_FD")
    return os.fdopen(int(fd), "w") if fd else sys.stderr


def _bos_in_front(path: Path, bos: str, bos_id: int) -> None:
    """The tokenizer's post-processor puts `bos` before one text and before each of a pair."""
    data = json.loads(path.read_text())
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }
    path.write_text(json.dumps(data, ensure_ascii=False))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source = Path(sys.argv[1]).resolve()
    progress = Progress(f"converting {source.name} for vLLM", stream=_progress_stream())
    progress.keep_ticking()  # reading the GGUF's metadata reports nothing for a minute or two
    try:
        convert(source, Path(sys.argv[2]), Steps(progress, PHASES))
    except BaseException:
        progress.finish(ok=False)
        raise
    progress.finish()
