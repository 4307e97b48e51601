"""Cross-tenant hits and per-run figures (pure), and the token lists they need (I/O).

A request's reused tokens (`cache_n`, the engine's own count) can only come from prompts
the engine saw before. What it may honestly reuse is the longest common prefix, in tokens,
that its prompt shares with an earlier request of the SAME tenant (that request's prompt
followed by its generated text, which the engine also keeps), or with the chat template's
opening that every tenant's prompt starts with (`public_len`: the longest prefix any two
tenants' first prompts share; the trace makes tenants' system prompts differ from their
first word, so this is only the template's opening tokens). Reusing more than that means
the tokens came from another tenant's request: a cross-tenant hit. "Earlier" is every
request of the tenant sent before this one, finished or not (generous, so no hit is
counted that an own request could explain). Tokens come from the engine's own
`/apply-template` and `/tokenize` (checked against the `prompt_tokens` it reported).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from bench.prefix.client import Outcome
from bench.prefix.trace import Request


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def public_len(first_prompts: Mapping[str, Sequence[int]]) -> int:
    """The longest prefix any two tenants' first prompts share (the template's opening)."""
    tenants = sorted(first_prompts)
    best = 0
    for i, a in enumerate(tenants):
        for b in tenants[i + 1 :]:
            best = max(best, lcp(first_prompts[a], first_prompts[b]))
    return best


def cross_tenant(
    outcomes: Sequence[Outcome],
    prompt_tokens: Mapping[int, Sequence[int]],
    seen_tokens: Mapping[tuple[int, str], Sequence[int]],
    system: str,
    public: int,
) -> list[dict[str, Any]]:
    """Per request: the reuse its own tenant's history allows, and any excess.

    1. Order the requests by when they were sent.
    2. For each, `own` = the longest prefix its prompt shares with any earlier request of
       the same tenant (prompt + generated text, `seen_tokens[(index, system)]`).
    3. `allowed` = max(own, public); a hit when cached > allowed (`excess` tokens), and a
       raw hit when cached > own (counting the template's opening too).
    """
    ordered = sorted(outcomes, key=lambda o: o.sent_s)  # 1
    rows: list[dict[str, Any]] = []
    for k, out in enumerate(ordered):
        mine = prompt_tokens[out.index]
        own = max(  # 2
            (
                lcp(mine, seen_tokens[(e.index, system)])
                for e in ordered[:k]
                if e.tenant == out.tenant and e.status == 200
            ),
            default=0,
        )
        allowed = max(own, public)  # 3
        rows.append(
            {
                "index": out.index,
                "cached": out.cached_tokens,
                "own_lcp": own,
                "allowed": allowed,
                "hit": out.cached_tokens > allowed,
                "raw_hit": out.cached_tokens > own,
                "excess": max(0, out.cached_tokens - allowed),
            }
        )
    return rows


def summarize_run(
    outcomes: Sequence[Outcome], hits: Sequence[dict[str, Any]], wall_s: float
) -> dict[str, Any]:
    """One replay of the trace on one system: reuse, TTFT, cross-tenant hits, errors."""
    chat = [o for o in outcomes if not o.probe]
    probes = [o for o in outcomes if o.probe]
    ttft = [o.ttft_ms for o in chat if o.ttft_ms is not None]
    by_index = {h["index"]: h for h in hits}
    headers = [o for o in outcomes if o.header_reused is not None]
    return {
        "requests": len(outcomes),
        "errors": sum(o.status != 200 or o.error is not None for o in outcomes),
        "wall_s": round(wall_s, 2),
        "prompt_tokens": sum(o.prompt_tokens for o in chat),
        "reused_tokens": sum(o.cached_tokens for o in chat),
        "reused_tokens_probes": sum(o.cached_tokens for o in probes),
        "requests_with_reuse": sum(o.cached_tokens > 0 for o in chat),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p95_ms": percentile(ttft, 95),
        "ttft_mean_ms": statistics.fmean(ttft) if ttft else float("nan"),
        "cross_tenant_hits": sum(h["hit"] for h in hits),
        "cross_tenant_tokens": sum(h["excess"] for h in hits),
        "cross_tenant_hits_probes": sum(by_index[o.index]["hit"] for o in probes),
        "cross_tenant_hits_raw": sum(h["raw_hit"] for h in hits),
        "header_mismatches": sum(o.header_reused != o.cached_tokens for o in headers),
    }


async def token_lists(
    url: str, trace: Sequence[Request], outcomes: Mapping[str, Sequence[Outcome]]
) -> tuple[dict[int, list[int]], dict[tuple[int, str], list[int]], int]:
    """Tokenize every prompt, and every prompt + the text generated for it per system.

    `outcomes` maps a run's label (system and repetition) to its outcomes. Returns (prompt
    tokens by request index, seen tokens by (index, label), how many prompts' token counts
    differ from the `prompt_tokens` the engine reported).
    """
    prompts: dict[int, str] = {}
    prompt_tokens: dict[int, list[int]] = {}
    seen: dict[tuple[int, str], list[int]] = {}
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:

        async def tokenize(text: str) -> list[int]:
            r = await client.post(
                "/tokenize", json={"content": text, "add_special": True, "parse_special": True}
            )
            r.raise_for_status()
            return [t if isinstance(t, int) else t["id"] for t in r.json()["tokens"]]

        for req in trace:
            r = await client.post("/apply-template", json={"messages": req.body_messages()})
            r.raise_for_status()
            prompts[req.index] = r.json()["prompt"]
            prompt_tokens[req.index] = await tokenize(prompts[req.index])
        for system, outs in outcomes.items():
            for o in outs:
                text = prompts[o.index] + o.completion
                seen[(o.index, system)] = (
                    await tokenize(text) if o.completion else prompt_tokens[o.index]
                )
    mismatches = sum(
        o.status == 200 and o.prompt_tokens != len(prompt_tokens[o.index])
        for outs in outcomes.values()
        for o in outs
    )
    return prompt_tokens, seen, mismatches
