"""P19, P20 and adapters on the real llama-server (issue 27): warm prefixes across a
swap, public prefixes under isolation, and adapters' throughput.

    .venv/bin/python -m bench.prefix.tenancy [--quick] [--reps 3] [--only swap,public,adapters]

(a) swap: a tenant's 1,500-token system prompt; TTFT of its first request (cold), of a
    second one (warm: the slot holds it), and of the first after a governed unload + load,
    with saved prefixes (PREFIX_CACHE_PERSIST=true: the stopping engine saved the slot,
    the new one restores it) and without (false). Both runners alternate per repetition;
    ratio to warm, median over repetitions. Target: with ≤ 1.3x warm.
(b) public: N tenants, one shared 1,500-token system prompt followed by each tenant's own
    instructions, two slots (tenants take each other's slots all the time), with the
    prompt declared a public prefix and without; prompt tokens prefilled per request (its
    prompt tokens minus those reused from the cache), cross-tenant reuse beyond the public
    part (each request's reuse against the longest prefix it shares with an earlier request
    of its own tenant, or the public part: `analysis.cross_tenant`), and a hidden-suffix
    probe per tenant (another tenant's exact prompt) that must reuse no more than the
    public part. Target: public part prefilled once per slot, not per tenant; 0 beyond.
(c) adapters: one engine (4 slots) with 4 adapters; closed loop of 4 clients, each its own
    tenant, on the base model then each on its own adapter, interleaved pairs; the same
    16 tokens decoded per request (`ignore_eos`). Requests/s ratio adapters ÷ base.

Each scenario starts its own runners (`bench/prefix/engines.start_runner`, which starts
llama-server from a models file) and prints a Markdown table; everything goes to
`bench/results/tenancy-<time>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.prefix import analysis
from bench.prefix.engines import MODEL_PATH, Served, require_engine, start_runner
from bench.proxy.procs import REPO_ROOT, loadavg, machine_facts
from governance.signing import combine, load_private_key, propose, sign
from tests.support.adapters import ADAPTERS_DIR as ADAPTERS
from tests.support.adapters import engine_of

KEYS = REPO_ROOT / "keys"
RUNNER_ID = "bench-runner"
WORDS = (
    "account",
    "billing",
    "invoice",
    "refund",
    "order",
    "parcel",
    "delivery",
    "warranty",
    "repair",
    "upgrade",
    "plan",
    "subscription",
    "discount",
    "voucher",
    "store",
    "branch",
    "opening",
    "hours",
    "holiday",
    "policy",
    "return",
    "label",
    "courier",
    "tracking",
    "number",
    "customer",
    "manager",
    "ticket",
    "priority",
    "escalation",
    "survey",
    "feedback",
)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def text(words: int, seed: int) -> str:
    """`words` seeded words as sentences (~1.3 tokens a word for Gemma)."""
    out = [WORDS[(seed * 7 + i * 13 + i * i) % len(WORDS)] for i in range(words)]
    return " ".join(" ".join(out[i : i + 12]).capitalize() + "." for i in range(0, words, 12))


SHARED = "You are the support desk of the platform. " + text(1300, 1)
"""The operator's system prompt every tenant's app sends (~1,500 tokens)."""


def _token(operation: str, model: str | None, params: dict[str, Any]) -> dict[str, Any]:
    proposal = propose(
        operation=operation,
        model_id=model,
        params=params,
        aud=RUNNER_ID,
        iss="gov-dev",
        issued_at=int(time.time()),
    )
    keys = [load_private_key((KEYS / f"{n}.key").read_bytes()) for n in ("admin1", "admin2")]
    return combine(sign(proposal, key) for key in keys)


def governed(url: str, path: str, operation: str, body: dict[str, Any]) -> httpx.Response:
    params = {k: v for k, v in body.items() if k != "modelId"}
    token = _token(operation, body.get("modelId"), params)
    return httpx.post(url + path, json={**body, "verifiedOpToken": token}, timeout=600)


def reload(url: str, model: str) -> None:
    """Governed unload, then load; returns once the load task completed."""
    r = governed(url, "/v1/models/unload", "model-unload", {"modelId": model})
    r.raise_for_status()
    r = governed(url, "/v1/models/load", "model-load", {"modelId": model})
    r.raise_for_status()
    task = r.json()["taskId"]
    while (status := httpx.get(f"{url}/v1/models/load/{task}").json()["status"]) not in (
        "completed",
        "failed",
        "cancelled",
    ):
        time.sleep(0.05)
    if status != "completed":
        raise RuntimeError(f"reload of {model} {status}")


def ask(url: str, model: str, tenant: str, system: str, user: str, **extra: Any) -> dict[str, Any]:
    """One streamed chat: TTFT (first content chunk), prompt tokens, tokens reused."""
    body = {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    sent = time.monotonic()
    out: dict[str, Any] = {"tenant": tenant, "ttft_ms": None, "prompt": 0, "cached": 0}
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        json=body,
        headers={"X-Tenant-ID": tenant},
        timeout=600,
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or ():
                if (choice.get("delta") or {}).get("content") and out["ttft_ms"] is None:
                    out["ttft_ms"] = (time.monotonic() - sent) * 1e3
            if isinstance(event.get("timings"), dict):
                out["cached"] = event["timings"].get("cache_n", 0)
            if isinstance(event.get("usage"), dict):
                out["prompt"] = event["usage"].get("prompt_tokens", 0)
    return out


def _env(cache: Path, **extra: str) -> dict[str, str]:
    return {
        "GOVERNANCE_REGISTRY": str(KEYS / "registry.dev.json"),
        "RUNNER_ID": RUNNER_ID,
        "PREFIX_CACHE_DIR": str(cache),
        **extra,
    }


def _models(parallel: int, ctx: int, threads: int, extra: str = "") -> str:
    return (
        "models:\n  - id: gemma\n    backend: llama-server\n"
        f"    path: {MODEL_PATH}\n    context_length: {ctx}\n    parallel: {parallel}\n"
        f'    preload: true\n    args: ["--threads", "{threads}"]\n' + extra
    )


@contextlib.contextmanager
def runner(models: str, env: dict[str, str]) -> Iterator[Served]:
    with start_runner(models, env, timeout=300) as served:
        yield served


@contextlib.contextmanager
def _runner_in_tmp(models: str, **env: str) -> Iterator[Served]:
    """A runner whose prefix cache lives in a fresh temporary folder."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-prefixes-") as tmp,
        runner(models, _env(Path(tmp), **env)) as served,
    ):
        yield served


# -- (a) swap-back ---------------------------------------------------------------------


def swap(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for rep in range(args.reps):
        order = ("saved", "none") if rep % 2 == 0 else ("none", "saved")
        for system in order:
            with tempfile.TemporaryDirectory(prefix="bench-prefixes-") as tmp:
                persist = "true" if system == "saved" else "false"
                env = _env(Path(tmp), PREFIX_CACHE_PERSIST=persist)
                with runner(_models(1, 4096, args.threads), env) as r:
                    prompt = SHARED + f" Tenant {rep} rules: " + text(40, rep + 10)
                    cold = ask(r.url, "gemma", "t-swap", prompt, "First question?")
                    warm = ask(r.url, "gemma", "t-swap", prompt, "Second question?")
                    reload(r.url, "gemma")
                    after = ask(r.url, "gemma", "t-swap", prompt, "Third question?")
            row = {"rep": rep, "system": system, "cold": cold, "warm": warm, "after": after}
            rows.append(row)
            _log(
                f"swap {system} #{rep}: cold {cold['ttft_ms']:.0f} ms, warm "
                f"{warm['ttft_ms']:.0f} ms, after reload {after['ttft_ms']:.0f} ms "
                f"({after['cached']}/{after['prompt']} reused)"
            )
    return {"rows": rows, "summary": _swap_summary(rows)}


def _swap_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for system in ("saved", "none"):
        mine = [r for r in rows if r["system"] == system]
        after = [r["after"]["ttft_ms"] / r["warm"]["ttft_ms"] for r in mine]
        cold = [r["cold"]["ttft_ms"] / r["warm"]["ttft_ms"] for r in mine]
        out[system] = {
            "after_over_warm": statistics.median(after),
            "cold_over_warm": statistics.median(cold),
            "warm_ms": statistics.median(r["warm"]["ttft_ms"] for r in mine),
            "after_ms": statistics.median(r["after"]["ttft_ms"] for r in mine),
            "after_reused": statistics.median(r["after"]["cached"] for r in mine),
            "prompt_tokens": statistics.median(r["after"]["prompt"] for r in mine),
        }
    return out


# -- (b) public prefix -------------------------------------------------------------------


def public(args: argparse.Namespace) -> dict[str, Any]:
    declared = (
        f"    public_prefixes:\n      - name: platform\n        system: {json.dumps(SHARED)}\n"
    )
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        order = ("declared", "none") if rep % 2 == 0 else ("none", "declared")
        for system in order:
            extra = declared if system == "declared" else ""
            with _runner_in_tmp(_models(2, 4096, args.threads, extra)) as r:
                run = _public_run(r, args)
                run["public_tokens"] = _public_tokens(r)
            run.update(rep=rep, system=system)
            runs.append(run)
            prefilled = [o["prompt"] - o["cached"] for o in run["chat"]]
            _log(
                f"public {system} #{rep}: prefilled {statistics.fmean(prefilled):.0f} tokens "
                f"a request, probes reused at most {max(o['cached'] for o in run['probes'])} "
                f"(public part {run['public_tokens']})"
            )
    return {"runs": runs, "summary": _public_summary(runs)}


def _own(tenant: int) -> str:
    return f" Tenant {tenant} own instructions: " + text(30, 100 + tenant)


def _public_run(r: Served, args: argparse.Namespace) -> dict[str, Any]:
    """Each tenant's turns round robin (tenants outnumber the two slots), then one probe per
    tenant: the next tenant's exact system prompt and first question. Every prompt is
    tokenized by the engine itself, for the reuse each request may have of its own."""
    engine = engine_of(r.proc.pid)  # its port, and its key from its file
    chat, probes = [], []
    for turn in range(args.turns):
        for t in range(args.tenants):
            system, user = SHARED + _own(t), f"Question {turn}?"
            o = ask(r.url, "gemma", f"t{t}", system, user)
            o["tokens"] = _tokens(engine, system, user)
            chat.append(o)
    for t in range(args.tenants):
        system, user = SHARED + _own((t + 1) % args.tenants), "Question 0?"
        o = ask(r.url, "gemma", f"t{t}", system, user)
        o["tokens"] = _tokens(engine, system, user)
        probes.append(o)
    return {"chat": chat, "probes": probes}


def _tokens(engine: tuple[str, dict[str, str]], system: str, user: str | None) -> list[int]:
    """The engine's tokens for a chat (`user` None: cut right after the system text)."""
    url, auth = engine
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user or "-"}]
    prompt = httpx.post(url + "/apply-template", json={"messages": messages}, headers=auth)
    text = prompt.json()["prompt"]
    if user is None:
        text = text[: text.index(system) + len(system)]
    body = {"content": text, "add_special": True, "parse_special": True}
    tokens = httpx.post(url + "/tokenize", json=body, headers=auth).json()["tokens"]
    return [t if isinstance(t, int) else t["id"] for t in tokens]


def _public_tokens(r: Served) -> int:
    """The public part in tokens, as the engine counts it (its template, its tokenizer)."""
    return len(_tokens(engine_of(r.proc.pid), SHARED, None))


def _beyond(run: dict[str, Any], request: dict[str, Any], earlier: Sequence[dict[str, Any]]) -> int:
    """Tokens a request reused beyond what it may: the public part, or the longest prefix
    it shares with an earlier request of its own tenant."""
    own = max(
        (
            analysis.lcp(request["tokens"], o["tokens"])
            for o in earlier
            if o["tenant"] == request["tenant"]
        ),
        default=0,
    )
    return max(0, int(request["cached"]) - max(run["public_tokens"], own))


def _public_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for system in ("declared", "none"):
        mine = [r for r in runs if r["system"] == system]
        prefilled = [statistics.fmean(o["prompt"] - o["cached"] for o in r["chat"]) for r in mine]
        prompts = [statistics.fmean(o["prompt"] for o in r["chat"]) for r in mine]
        ttft = [analysis.percentile([o["ttft_ms"] for o in r["chat"]], 50) for r in mine]
        beyond = sum(
            _beyond(r, o, seq[:i])
            for r in mine
            for seq in [r["chat"] + r["probes"]]
            for i, o in enumerate(seq)
        )
        out[system] = {
            "prefilled_per_request": statistics.median(prefilled),
            "prompt_tokens": statistics.median(prompts),
            "public_tokens": mine[0]["public_tokens"],
            "cross_tenant_tokens_beyond_public": beyond,
            "probe_max_reused": max(o["cached"] for r in mine for o in r["probes"]),
            "ttft_p50_ms": statistics.median(ttft),
        }
    return out


# -- (c) adapters ----------------------------------------------------------------------


def adapters(args: argparse.Namespace) -> dict[str, Any]:
    manifest = json.loads((ADAPTERS / "manifest.json").read_text())
    names = [a["name"] for a in manifest["adapters"]][:4]
    declared = "    adapters:\n" + "".join(
        f"      - {{name: {n}, path: {ADAPTERS / (n + '.gguf')}, tenants: [t{i}]}}\n"
        for i, n in enumerate(names)
    )
    pairs: list[dict[str, Any]] = []
    with _runner_in_tmp(_models(4, 1024, args.threads, declared)) as r:
        for phase in ("base", "adapters"):  # warm-up, not counted
            asyncio.run(_closed_loop(r.url, names, phase == "adapters", 2.0))
        for i in range(args.pairs):
            order = ("base", "adapters") if i % 2 == 0 else ("adapters", "base")
            pair: dict[str, Any] = {"order": order, "loadavg": loadavg()}
            for phase in order:
                pair[phase] = asyncio.run(
                    _closed_loop(r.url, names, phase == "adapters", args.duration)
                )
            _log(
                f"adapters pair {i + 1}: base {pair['base']['rps']:.2f} req/s, "
                f"4 adapters {pair['adapters']['rps']:.2f} req/s"
            )
            pairs.append(pair)
    ratios = [p["adapters"]["rps"] / p["base"]["rps"] for p in pairs]
    return {
        "pairs": pairs,
        "summary": {
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "base_rps": statistics.median(p["base"]["rps"] for p in pairs),
            "adapters_rps": statistics.median(p["adapters"]["rps"] for p in pairs),
            "errors": sum(p[k]["errors"] for p in pairs for k in ("base", "adapters")),
        },
    }


async def _closed_loop(
    url: str, names: Sequence[str], on_adapters: bool, duration_s: float
) -> dict[str, Any]:
    """4 clients, client i as tenant t{i}, on `gemma:<its adapter>` or the base model."""
    done = errors = 0
    latencies: list[float] = []
    stop = time.monotonic() + duration_s
    async with httpx.AsyncClient(timeout=600) as client:

        async def one_client(i: int) -> None:
            nonlocal done, errors
            model = f"gemma:{names[i]}" if on_adapters else "gemma"
            k = 0
            while time.monotonic() < stop:
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": f"Client {i}, question {k}?"}],
                    "max_tokens": 16,
                    "ignore_eos": True,
                    "temperature": 0,
                }
                sent = time.monotonic()
                r = await client.post(
                    url + "/v1/chat/completions", json=body, headers={"X-Tenant-ID": f"t{i}"}
                )
                latencies.append((time.monotonic() - sent) * 1e3)
                if r.status_code == 200:
                    done += 1
                else:
                    errors += 1
                k += 1

        t0 = time.monotonic()
        await asyncio.gather(*(one_client(i) for i in range(len(names))))
        wall = time.monotonic() - t0
    return {
        "requests": done,
        "errors": errors,
        "rps": done / wall,
        "p50_ms": analysis.percentile(latencies, 50),
    }


# -- report ----------------------------------------------------------------------------


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown(result: dict[str, Any]) -> str:
    lines = []
    if "swap" in result:
        s, n = result["swap"]["summary"]["saved"], result["swap"]["summary"]["none"]
        lines += [
            _row("(a) swap-back, TTFT of a 1,500-token prompt", "saved prefixes", "none"),
            "|---|---|---|",
            _row(
                "after unload + load ÷ warm (target ≤ 1.3)",
                f"{s['after_over_warm']:.2f}",
                f"{n['after_over_warm']:.2f}",
            ),
            _row("cold ÷ warm", f"{s['cold_over_warm']:.2f}", f"{n['cold_over_warm']:.2f}"),
            _row(
                "warm / after reload (ms)",
                f"{s['warm_ms']:.0f} / {s['after_ms']:.0f}",
                f"{n['warm_ms']:.0f} / {n['after_ms']:.0f}",
            ),
            _row(
                "tokens reused after reload / prompt",
                f"{s['after_reused']:.0f} / {s['prompt_tokens']:.0f}",
                f"{n['after_reused']:.0f} / {n['prompt_tokens']:.0f}",
            ),
            "",
        ]
    if "public" in result:
        d, n = result["public"]["summary"]["declared"], result["public"]["summary"]["none"]
        lines += [
            _row("(b) tenants sharing a 1,500-token system prompt", "declared", "not declared"),
            "|---|---|---|",
            _row(
                f"prompt tokens prefilled per request (of {d['prompt_tokens']:.0f})",
                f"{d['prefilled_per_request']:.0f}",
                f"{n['prefilled_per_request']:.0f}",
            ),
            _row(
                f"cross-tenant tokens reused beyond the public part ({d['public_tokens']})",
                d["cross_tenant_tokens_beyond_public"],
                n["cross_tenant_tokens_beyond_public"],
            ),
            _row(
                "hidden-suffix probes: most tokens reused",
                d["probe_max_reused"],
                n["probe_max_reused"],
            ),
            _row("TTFT p50 (ms)", f"{d['ttft_p50_ms']:.0f}", f"{n['ttft_p50_ms']:.0f}"),
            "",
        ]
    if "adapters" in result:
        a = result["adapters"]["summary"]
        spread = f"{a['ratio']:.2f} [{a['ratio_min']:.2f}, {a['ratio_max']:.2f}]"
        lines += [
            _row("(c) 4 tenants, 4 clients, one engine (4 slots)", "figure"),
            "|---|---|",
            _row("requests/s on 4 adapters ÷ base model alone", spread),
            _row("requests/s: base / adapters", f"{a['base_rps']:.2f} / {a['adapters_rps']:.2f}"),
            _row("errors", a["errors"]),
            "",
        ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.prefix.tenancy", description=__doc__)
    p.add_argument("--quick", action="store_true", help="1 repetition, short runs (smoke)")
    p.add_argument("--reps", type=int, default=None, help="3 (--quick: 1)")
    p.add_argument("--only", default="swap,public,adapters")
    p.add_argument("--tenants", type=int, default=6)
    p.add_argument("--turns", type=int, default=None, help="per tenant: 3 (--quick: 2)")
    p.add_argument("--pairs", type=int, default=None, help="adapter pairs: 3 (--quick: 1)")
    p.add_argument("--duration", type=float, default=None, help="s per run: 20 (--quick: 6)")
    p.add_argument("--threads", type=int, default=1, help="engine threads")
    args = p.parse_args(argv)
    for name, full, quick in (
        ("reps", 3, 1),
        ("turns", 3, 2),
        ("pairs", 3, 1),
        ("duration", 20.0, 6.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    require_engine()
    started = datetime.now(UTC)
    facts = machine_facts()
    result: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": ".venv/bin/python -m bench.prefix.tenancy " + " ".join(sys.argv[1:]),
        "machine": {k: facts[k] for k in ("nproc", "cpu", "git_head")},
        "loadavg_before": loadavg(),
    }
    for name, run in (("swap", swap), ("public", public), ("adapters", adapters)):
        if name in args.only:
            result[name] = run(args)
    result["loadavg_after"] = loadavg()
    out_dir = REPO_ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"tenancy-{started.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    print("\n" + markdown(result) + "\n")
    _log(f"wrote {out.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
