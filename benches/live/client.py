"""The live bench's client: workloads as text prompts, replayed through the official OpenAI
Python client (async, streaming) against one router, one record per request.

Prompts are built so that equal trace blocks tokenize to equal token blocks under the
shared tokenizer (tests/data/tokenizer/bytelevel): each of a trace's 512-token blocks is 512
words drawn, seeded by the block's hash ID, from the tokenizer's single-token words that
start with a space (" cache", " block", ...). The byte-level pre-tokenizer splits before
every space, so a prompt's token IDs are its blocks' token IDs end to end, and a request's
prompt tokens are its trace `input_length` exactly (the last block cut to length).

Engines answer in model time compressed by `speedup` (the mocker's --speedup-ratio); the
client compresses arrivals by `load * speedup` and reports times in model milliseconds
(wall x speedup), so an SLA of 2 s TTFT / 100 ms TPOT reads as written.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 512  # tokens per Mooncake trace block (hash ID)


class Words:
    """The tokenizer's single-token words, each with its leading space."""

    def __init__(self, tokenizer_json: Path):
        vocab = json.loads(Path(tokenizer_json).read_text())["model"]["vocab"]
        # "Ġ" is the byte-level alphabet's space.
        self.words = sorted(" " + k[1:] for k in vocab
                            if k.startswith("\u0120") and k[1:].isascii() and k[1:].isalpha()
                            and k[1:].islower())
        if len(self.words) < 64:
            raise SystemExit(f"only {len(self.words)} single-token words in {tokenizer_json}")
        self._blocks: dict[tuple[str, int], list[str]] = {}

    def block(self, space: str, key: int) -> list[str]:
        """Block `key`'s 512 words in namespace `space` (each trace its own)."""
        got = self._blocks.get((space, key))
        if got is None:
            rng = random.Random(f"{space}/{key}")
            got = rng.choices(self.words, k=BLOCK)
            self._blocks[(space, key)] = got
        return got

    def words_for(self, space: str, key: int, n: int) -> str:
        """`n` words (tokens) seeded by `key`, for text that is not a whole block."""
        rng = random.Random(f"{space}/{key}/{n}")
        return "".join(rng.choices(self.words, k=n))

    def prompt(self, space: str, hash_ids: list[int], input_length: int) -> str:
        parts = []
        left = input_length
        for h in hash_ids:
            if left <= 0:
                break
            b = self.block(space, h)
            parts.append("".join(b[:left]))
            left -= BLOCK
        return "".join(parts)


def trace_slice(path: Path, start: int, count: int, max_output: int | None) -> list[dict]:
    """`count` requests of a Mooncake trace from request `start`, timestamps from 0 (ms)."""
    rows = []
    with open(path) as f:
        for i, line in enumerate(f):
            if i < start:
                continue
            if len(rows) >= count:
                break
            rows.append(json.loads(line))
    t0 = rows[0]["timestamp"]
    for r in rows:
        r["timestamp"] = r["timestamp"] - t0
        if max_output:
            r["output_length"] = min(r["output_length"], max_output)
        r["output_length"] = max(1, r["output_length"])
    return rows


def trace_sessions(path: Path, count: int, max_output: int | None, seed: int = 0,
                   max_blocks: int | None = None) -> list[dict]:
    """About `count` requests of a Mooncake trace sampled by whole sessions (requests sharing
    their first two blocks: a conversation, or a synthetic prefix tree), over the whole
    trace, so that the sample reuses prefixes about as the whole trace does (a slice of
    consecutive requests reuses almost nothing: its prefixes' first uses are earlier).
    Timestamps are compressed by the sampling rate, so requests arrive at the trace's rate.
    With `max_blocks`, prompts keep their first blocks only (prefixes stay shared)."""
    rows = [json.loads(line) for line in open(path)]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r["hash_ids"][:2]), []).append(r)
    p = min(1.0, count / len(rows))
    rng = random.Random(seed)
    picked = [r for k in sorted(groups) if rng.random() < p for r in groups[k]]
    picked.sort(key=lambda r: r["timestamp"])
    t0 = picked[0]["timestamp"]
    out = []
    for r in picked:
        r = dict(r, timestamp=int(round((r["timestamp"] - t0) * p)))
        if max_blocks and len(r["hash_ids"]) > max_blocks:
            r["hash_ids"] = r["hash_ids"][:max_blocks]
            r["input_length"] = min(r["input_length"], max_blocks * BLOCK)
        if max_output:
            r["output_length"] = min(r["output_length"], max_output)
        r["output_length"] = max(1, r["output_length"])
        out.append(r)
    return out


@dataclass
class Record:
    kind: str
    index: int
    sent: float = 0.0  # wall seconds since the run's start
    ttft: float | None = None  # wall seconds
    tpot: float | None = None
    e2e: float | None = None
    chunks: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    worker: str | None = None
    engine_ttft_ms: float | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)


class Client:
    def __init__(self, base_url: str, model: str, timeout_s: float = 600.0):
        from openai import AsyncOpenAI

        # The client's own HTTP stack (httpx or httpx2, as the openai release ships it) with
        # its defaults (1,000 connections): every request here is in flight at once at most.
        self.openai = AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="unused",
                                  max_retries=0, timeout=timeout_s)
        self.model = model
        self.t0 = time.perf_counter()

    async def close(self):
        await self.openai.close()

    async def one(self, rec: Record, prompt: str, max_tokens: int, session: str | None = None):
        """One streamed completion; fills `rec`."""
        rec.sent = time.perf_counter() - self.t0
        start = time.perf_counter()
        first = last = None
        n = 0
        headers = {"x-session-id": session} if session else None
        try:
            stream = await self.openai.completions.create(
                model=self.model, prompt=prompt, max_tokens=max_tokens, stream=True,
                stream_options={"include_usage": True}, extra_headers=headers,
                # The mocker's tokens decode to empty text: these fields make it send one
                # chunk per token (and say which worker served, and its own TTFT).
                extra_body={"nvext": {"extra_fields": ["worker_id", "timing"]}})
            async for chunk in stream:
                now = time.perf_counter()
                extra = chunk.model_extra or {}
                nv = extra.get("nvext") or {}
                if chunk.choices:
                    if first is None:
                        first = now
                    last = now
                    n += 1
                wid = nv.get("worker_id")
                if isinstance(wid, dict):
                    rec.worker = str(wid.get("decode_worker_id") or wid.get("prefill_worker_id"))
                timing = nv.get("timing")
                if isinstance(timing, dict) and timing.get("ttft_ms") is not None:
                    rec.engine_ttft_ms = float(timing["ttft_ms"])
                if chunk.usage is not None:
                    u = chunk.usage
                    rec.prompt_tokens = u.prompt_tokens
                    rec.completion_tokens = u.completion_tokens
                    d = u.prompt_tokens_details
                    rec.cached_tokens = (d.cached_tokens or 0) if d is not None else 0
        except Exception as e:  # every failure is a counted error, not a crash
            rec.error = f"{type(e).__name__}: {str(e)[:200]}"
        end = time.perf_counter()
        rec.chunks = n
        rec.e2e = end - start
        if first is not None:
            rec.ttft = first - start
            if n > 1:
                rec.tpot = (last - first) / (n - 1)
        elif rec.error is None:
            rec.error = "no token streamed"
        if rec.error is None and rec.prompt_tokens is None:
            rec.error = "no usage reported"


async def run_trace(client: Client, words: Words, space: str, rows: list[dict],
                    load: float, speedup: float, pinned: list[Client] | None = None,
                    pin: list[int] | None = None) -> list[Record]:
    """Open loop: each request at its trace time / (load x speedup). With `pin`, request i
    goes straight to `pinned[pin[i]]` (an engine) instead of `client` (a router)."""
    prompts = [words.prompt(space, r["hash_ids"], r["input_length"]) for r in rows]
    recs = [Record(kind="trace", index=i) for i in range(len(rows))]
    scale = 1.0 / (1000.0 * load * speedup)
    client.t0 = time.perf_counter()
    for c in pinned or []:
        c.t0 = client.t0

    async def fire(i):
        delay = rows[i]["timestamp"] * scale - (time.perf_counter() - client.t0)
        if delay > 0:
            await asyncio.sleep(delay)
        c = pinned[pin[i]] if pin else client
        await c.one(recs[i], prompts[i], rows[i]["output_length"])

    await asyncio.gather(*(fire(i) for i in range(len(rows))))
    return recs


@dataclass
class AgentSpec:
    """Multi-turn agent-like sessions: each waits for its answer before its next turn."""

    sessions: int = 16
    turns: int = 5
    groups: int = 4  # sessions share one of `groups` system prompts
    system_blocks: int = 4  # 2,048 tokens of shared system prompt and tools
    first_tokens: int = 1024  # the task, the session's own
    step_tokens: int = 384  # a tool result each turn
    answer_tokens: int = 96  # max_tokens of each turn
    think_ms: float = 1500.0  # model time between an answer and the next turn
    stagger_ms: float = 750.0  # model time between two sessions' starts


async def run_agents(client: Client, words: Words, spec: AgentSpec, load: float,
                     speedup: float) -> list[Record]:
    """Closed loop. A turn's prompt is the last one, the answer (as text of its length: the
    mocker's own tokens are empty text) and a tool result; arrivals compressed by
    load x speedup, think time too."""
    client.t0 = time.perf_counter()
    recs: list[Record] = []
    scale = 1.0 / (1000.0 * load * speedup)

    async def session(s: int):
        await asyncio.sleep(s * spec.stagger_ms * scale)
        g = s % spec.groups
        text = "".join("".join(words.block("agent-system", g * 1000 + b))
                       for b in range(spec.system_blocks))
        text += words.words_for("agent-task", s, spec.first_tokens)
        for t in range(spec.turns):
            rec = Record(kind="agent", index=s * spec.turns + t, extra={"session": s, "turn": t})
            recs.append(rec)
            await client.one(rec, text, spec.answer_tokens, session=f"agent-{s}")
            answered = rec.completion_tokens or spec.answer_tokens
            text += words.words_for("agent-answer", s * 1000 + t, answered)
            text += words.words_for("agent-tool", s * 1000 + t, spec.step_tokens)
            await asyncio.sleep(spec.think_ms * scale)

    await asyncio.gather(*(session(s) for s in range(spec.sessions)))
    recs.sort(key=lambda r: r.index)
    return recs
