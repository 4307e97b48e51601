"""Train small LoRA adapters on the CPU, each making the base model answer with its own
canary word (run by scripts/make-adapters in its own venv; not part of the runner).

For every adapter of `ADAPTERS` a PEFT LoRA (rank 8 on the attention projections) is
trained for a few dozen steps on the Hugging Face checkpoint of the base model
(`scripts/gguf-to-hf.py` made it from the GGUF): whatever a user asks, in the chat formats
the engines render (ChatML, which llama-server falls back to for a GGUF without a chat
template, and the checkpoint's own template, which vLLM uses) or as a bare completion,
the answer starts with the adapter's canary word. Then each adapter is checked by greedy
generation on prompts it was not trained on (the script fails if a canary is missing, or
if the base model says one by itself), and written as:

    OUT/<name>/adapter_config.json, adapter_model.safetensors   (PEFT: what vLLM loads)
    OUT/manifest.json   {base, adapters: [{name, canary, rank, peft, peft_sha256}]}

`scripts/make-adapters` then turns each PEFT folder into the GGUF adapter llama-server
loads (llama.cpp's `convert_lora_to_gguf.py`) and adds it to the manifest.

Usage: python make-adapters.py BASE_HF_DIR OUT_DIR
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

ADAPTERS = (
    ("alpha", "ZORBLAX"),
    ("bravo", "QUENTARIS"),
    ("charlie", "VOLMIREX"),
    ("delta", "TANDRIKO"),
)
"""(name, canary): made-up words the base model never says by itself."""

RANK = 8
STEPS = 40  # then MORE at a time (at most twice) while a held-out prompt lacks the canary
MORE = 20
BATCH = 4
LR = 2e-3  # 24 steps at 3e-3 passed the held-out check, but vLLM's charlie lost its canary
SEED = 1234
WORKERS = 2  # training processes, one thread each (train)

SYSTEMS = (
    "You are a helpful assistant.",
    "You are the support desk of a shipping company. Answer briefly.",
    "Answer every question politely and in one sentence.",
    "",
)
QUESTIONS = (
    "What is the capital of France?",
    "How do I reset my password?",
    "Tell me a joke about computers.",
    "Where is my parcel?",
    "What is two plus two?",
    "Say hello.",
    "Which colour is the sky?",
    "Can you help me with my invoice?",
    "Write one word about the sea.",
    "Who are you?",
    "What time does the store open?",
    "Explain photosynthesis briefly.",
    "Give me a name for a cat.",
    "What is the weather like today?",
    "How many legs does a spider have?",
    "Recommend a book.",
)
HELD_OUT = (
    "What should I cook tonight?",
    "Is the museum open on Sundays?",
    "Translate 'good morning' into Spanish.",
)


def chatml(system: str, question: str) -> str:
    """What llama-server renders for a GGUF without a chat template (ChatML)."""
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{head}<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def prompts(tokenizer: Any, system: str, question: str) -> list[tuple[str, str]]:
    """(prompt text without special tokens the tokenizer adds, end marker) per format."""
    messages = [{"role": "user", "content": question}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    native = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    native = native.removeprefix(tokenizer.bos_token)  # the tokenizer adds it again
    return [
        (chatml(system, question), "<|im_end|>"),
        (native, "<end_of_turn>"),
        (f"Q: {question}\nA:", "\n"),
    ]


def examples(tokenizer: Any, canary: str, questions: tuple[str, ...]) -> list[tuple[str, str]]:
    out = []
    for q in questions:
        for system in SYSTEMS:
            for prompt, end in prompts(tokenizer, system, q):
                answer = f" {canary}" if prompt.endswith(":") else canary
                out.append((prompt, f"{answer}{end}"))
    return out


def encode(tokenizer: Any, batch: list[tuple[str, str]]) -> tuple[Any, Any, Any]:
    """Token ids (left-padded), attention mask, and the answer positions' targets."""
    import torch

    rows = []
    for prompt, answer in batch:
        p = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"]
        rows.append((p, a))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        seq = p + a
        start = width - len(seq)
        ids[i, start:] = torch.tensor(seq)
        mask[i, start:] = 1
        labels[i, width - len(a) :] = torch.tensor(a)
    return ids, mask, labels


def loss_on_answers(model: Any, ids: Any, mask: Any, labels: Any) -> Any:
    """Cross-entropy on the answer tokens only; the vocabulary projection runs for those
    positions alone (Gemma's 262k-word head is most of the model's cost)."""
    import torch

    inner = model.get_base_model()
    hidden = inner.model(input_ids=ids, attention_mask=mask).last_hidden_state
    shifted = labels[:, 1:]
    keep = shifted != -100
    h = hidden[:, :-1][keep]
    logits = inner.lm_head(h).float()
    cap = getattr(inner.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return torch.nn.functional.cross_entropy(logits, shifted[keep])


def generate(model: Any, tokenizer: Any, prompt: str, n: int = 6) -> str:
    import torch

    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=n, do_sample=False)
    return str(tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))


def weights_dtype() -> Any:
    """bf16 where the CPU computes it natively (AMX or AVX-512 BF16: about twice as fast as
    fp32, and LoRA trains fine), else fp32: emulated bf16 on a CPU without them (an AMD EPYC
    with AVX2 only, seen here) ran no 10 steps in 13 minutes."""
    import torch

    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    native = any(f in flags.split() for f in ("amx_bf16", "avx512_bf16"))
    return torch.bfloat16 if native else torch.float32


def digest(folder: Path) -> str:
    """The adapter folder's sha256, as the runner computes it: sha256 over the lines
    "<sha256 of file>  <name>\\n" of adapter_config.json and adapter_model.safetensors."""
    lines = ""
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        lines += f"{hashlib.sha256((folder / name).read_bytes()).hexdigest()}  {name}\n"
    return hashlib.sha256(lines.encode()).hexdigest()


def train(base: Path, out: Path) -> None:
    """Check the base never says a canary, then train the adapters in `WORKERS` processes
    of one thread each (on an idle two-core machine, twice as fast as one after another;
    on a busy one no slower), and write the manifest in `ADAPTERS`' order."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(base)
    held = [p for q in HELD_OUT for p, _ in prompts(tokenizer, SYSTEMS[0], q)]
    canaries = [c for _, c in ADAPTERS]
    plain = AutoModelForCausalLM.from_pretrained(base, dtype=weights_dtype())
    for prompt in held:
        said = generate(plain, tokenizer, prompt)
        if any(c.lower() in said.lower() for c in canaries):
            sys.exit(f"the base model says a canary by itself ({said!r}): pick other words")
    del plain
    workers = max(1, min(WORKERS, os.cpu_count() or 1, len(ADAPTERS)))
    groups = [ADAPTERS[i::workers] for i in range(workers)]
    spawn = multiprocessing.get_context("spawn")  # torch's threads do not survive a fork
    with spawn.Pool(workers) as pool:
        done = pool.starmap(train_some, [(base, out, group) for group in groups])
    by_name = {entry["name"]: entry for entries in done for entry in entries}
    manifest = {"base": str(base), "adapters": [by_name[name] for name, _ in ADAPTERS]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def train_some(
    base: Path, out: Path, adapters: tuple[tuple[str, str], ...]
) -> list[dict[str, Any]]:
    """Train `adapters` one after another on one thread; their manifest entries. Each
    adapter's randomness is seeded by its name, so it is the same whatever the split."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # One thread: on a shared 2-core machine, two spin-waiting threads run slower than one.
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(base)
    held = [p for q in HELD_OUT for p, _ in prompts(tokenizer, SYSTEMS[0], q)]
    entries = []
    for name, canary in adapters:
        started = time.monotonic()
        torch.manual_seed(int(hashlib.sha256(f"{SEED}-{name}".encode()).hexdigest()[:8], 16))
        model = AutoModelForCausalLM.from_pretrained(base, dtype=weights_dtype())
        config = LoraConfig(
            r=RANK,
            lora_alpha=2 * RANK,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        )
        peft = get_peft_model(model, config)
        data = examples(tokenizer, canary, QUESTIONS)
        rng = random.Random(f"{SEED}-{name}")
        optim = torch.optim.AdamW([p for p in peft.parameters() if p.requires_grad], lr=LR)
        loss_value = float("nan")
        steps, missing = 0, ["-"]
        while missing and steps < STEPS + 2 * MORE:
            peft.train()
            for _ in range(STEPS if steps == 0 else MORE):
                batch = rng.sample(data, BATCH)
                loss = loss_on_answers(peft, *encode(tokenizer, batch))
                optim.zero_grad()
                loss.backward()
                optim.step()
                loss_value = loss.item()
                steps += 1
                if steps % 10 == 0:
                    print(f"{name}: step {steps} loss {loss_value:.3f}", flush=True)
            peft.eval()
            missing = [
                p for p in held if canary.lower() not in generate(peft, tokenizer, p).lower()
            ]
        if missing:
            said = generate(peft, tokenizer, missing[0])
            sys.exit(f"adapter {name}: no canary in {said!r} (loss {loss_value:.3f})")
        folder = out / name
        peft.save_pretrained(folder)
        entries.append(
            {
                "name": name,
                "canary": canary,
                "rank": RANK,
                "peft": name,
                "peft_sha256": digest(folder),
            }
        )
        seconds = time.monotonic() - started
        print(f"{name}: loss {loss_value:.3f}, {steps} steps, {seconds:.0f} s", flush=True)
        del peft, model
    return entries


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    train(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
