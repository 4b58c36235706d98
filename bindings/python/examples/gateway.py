"""An OpenAI-compatible gateway routing with prefix_router: the core path of the Rust example
in examples/gateway (no metrics, KV events, data-parallel ranks or replicas).

    python gateway.py --tokenizer tokenizer.json \
        --upstream http://127.0.0.1:8001 --upstream http://127.0.0.1:8002

Each `POST /v1/completions` (text or token IDs) and `POST /v1/chat/completions` (messages
rendered with the chat template of tokenizer_config.json) is tokenized, routed, and its body
forwarded to the chosen upstream, whole or streamed. Headers read: `x-session-id` (else the
body's `user`), `x-ttft-target-ms`/`x-tpot-target-ms` (admission targets), `x-priority`.
Prompts are tokenized on a worker thread, off the event loop. Answers: the upstream's, with
`x-routed-worker` and `x-predicted-cached-tokens`; 400 for a malformed request; 429 (with
`Retry-After` when waiting helps) when admission refuses; 502 when no upstream tried could be
reached (refused, or not accepting within the 2-s connect timeout: the request is tried on one
other worker first) or an answer broke; 503 when no worker is available; 504, naming the
timeout, when an upstream did not answer in time. `GET /health` shows each worker's requests
in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import time
from pathlib import Path

import anyio
import httpx
import jinja2
import prefix_router as pr
import uvicorn
from jinja2.sandbox import ImmutableSandboxedEnvironment
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from tokenizers import Tokenizer


class Invalid(Exception):
    """A malformed request: the message of a 400."""


def token_ids(body: dict) -> list[int]:
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not all(type(t) is int and 0 <= t < 2**32 for t in prompt):
        raise Invalid('"prompt" must be text (with --tokenizer) or an array of token IDs (u32)')
    return prompt


def raise_exception(message):  # for templates that reject a conversation on purpose
    raise Invalid(message)


class Prompts:
    """The model's tokenizer and chat template, used as vLLM (and the Rust gateway) use them."""

    def __init__(self, tokenizer: Path, config: Path | None):
        self.tokenizer = Tokenizer.from_file(str(tokenizer))
        self.template, self.specials = None, {}
        cfg = json.loads(config.read_text()) if config else {}
        source = cfg.get("chat_template")
        if isinstance(source, list):  # named templates: the "default" one
            source = next(t["template"] for t in source if t.get("name") == "default")
        if source:  # Jinja set up as `transformers` sets it up
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
            env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
            env.globals["raise_exception"] = raise_exception
            self.template = env.from_string(source)
            for k in ("bos_token", "eos_token"):  # text, or an object with `content`
                v = cfg.get(k)
                self.specials[k] = v.get("content", "") if isinstance(v, dict) else v or ""

    def tokens(self, chat: bool, body: dict) -> list[int]:
        """The prompt's token IDs: special tokens added to text completions, not to chats.
        Called off the event loop: `encode_batch` lets other threads run while it tokenizes
        (`encode` holds the GIL throughout)."""
        add = body.get("add_special_tokens")
        add = add if isinstance(add, bool) else not chat
        if chat:
            if self.template is None:
                raise Invalid("this gateway has no chat template: start it with --tokenizer-config")
            text = self.template.render(**self.chat_context(body))
        elif not isinstance(text := body.get("prompt"), str):
            return token_ids(body)
        return self.tokenizer.encode_batch([text], add_special_tokens=add)[0].ids

    def chat_context(self, body: dict) -> dict:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Invalid('missing "messages": a list of {"role", "content"}')
        rendered = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise Invalid(f'"messages"[{i}] has no "role"')
            content = m.get("content") or ""
            if isinstance(content, list):  # text parts joined with newlines, as vLLM does
                if not all(isinstance(p, dict) and p.get("type") == "text"
                           and isinstance(p.get("text"), str) for p in content):
                    raise Invalid(f'"messages"[{i}].content: only text parts are supported')
                content = "\n".join(p["text"] for p in content)
            if not isinstance(content, str):
                raise Invalid(f'"messages"[{i}].content is not text')
            rendered.append({**m, "content": content})
        extra = body.get("chat_template_kwargs")
        return {**(extra if isinstance(extra, dict) else {}), "messages": rendered,
                "add_generation_prompt": body.get("add_generation_prompt", True),
                "tools": body.get("tools"), **self.specials}


def is_token(choice) -> bool:
    """Whether a stream's first choice is one output token's event: a completion's choice
    with a `text`, or a chat choice whose `delta` has a `content`, even empty (vLLM sends one
    event per token, and a token that ends inside a UTF-8 character or is a skipped special
    token has no text). A chat's role-only first delta is not a token."""
    if not isinstance(choice, dict):
        return False
    if isinstance(choice.get("text"), str):
        return True
    delta = choice.get("delta")
    if not isinstance(delta, dict) or not isinstance(delta.get("content"), str):
        return False
    return bool(delta["content"]) or "role" not in delta


def error(status: int, message: str) -> JSONResponse:
    kind = {400: "invalid_request_error", 504: "timeout"}.get(status, "upstream_error")
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def shed_response(shed: pr.Shed) -> JSONResponse:
    """429 with the limit and the gate that refused it (body and ``x-shed-gate``, as the Rust
    gateway answers) and, when waiting can help, Retry-After (whole s)."""
    body = {"error": {"message": str(shed), "type": "overloaded", "code": f"shed_{shed.limit}",
                      "param": None, "gate": shed.gate, "measured_s": shed.measured_s,
                      "threshold_s": shed.threshold_s}}
    after = shed.retry_after_s
    headers = {"x-shed-gate": shed.gate}
    if after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(after)))
    return JSONResponse(body, status_code=429, headers=headers)


def admission(headers) -> dict:
    """The admission headers as route() takes them."""
    targets = {}
    for name, key in (("x-ttft-target-ms", "ttft_target_s"), ("x-tpot-target-ms", "tpot_target_s")):
        if (value := headers.get(name)) is not None:
            if not value.strip().isdigit() or int(value) == 0:
                raise Invalid(f"{name}: {value!r} is not a number of milliseconds above 0")
            targets[key] = int(value) / 1000
    priority = headers.get("x-priority", "standard").strip()
    if priority not in ("critical", "standard", "sheddable"):
        raise Invalid(f"x-priority: {priority!r} is not critical, standard or sheddable")
    return {**targets, "priority": priority}


class Relay(StreamingResponse):
    """A streamed answer passed through as it comes; the router hears the first content
    event, the usage event, and (whatever ends the stream: its end, an error, the client
    going away) the completion."""

    def __init__(self, gw, decision, tokens, salt, started, upstream, headers):
        self.gw, self.decision, self.tokens, self.salt = gw, decision, tokens, salt
        self.started, self.upstream = started, upstream
        self.first_at = self.last_at = None
        self.completion_tokens = self.cached = None
        self.contents, self.ended = 0, False
        super().__init__(self.chunks(), status_code=upstream.status_code, headers=headers,
                         media_type="text/event-stream")

    async def chunks(self):
        partial = b""
        async for chunk in self.upstream.aiter_raw():
            partial += chunk
            *lines, partial = partial.split(b"\n")
            for line in lines:
                self.watch(line)
            yield chunk
        self.ended = True

    def watch(self, line: bytes):
        if not line.startswith(b"data:"):
            return
        try:
            event = json.loads(line[5:])
        except ValueError:
            return  # [DONE]
        if not isinstance(event, dict):
            return
        if is_token((event.get("choices") or [None])[0]):
            self.contents += 1
            self.last_at = time.monotonic()
            if self.first_at is None:
                self.first_at = self.last_at
                self.gw.router.first_token(self.decision, self.first_at - self.started)
        usage = event.get("usage") or {}
        self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)
        self.cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", self.cached)

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            with self.decision:  # completes it
                if isinstance(self.cached, int):
                    self.gw.reported(self.decision, self.tokens, self.salt, self.cached)
                after = (self.completion_tokens or self.contents) - 1
                if self.ended and self.contents and after > 0 and self.last_at > self.first_at:
                    self.gw.router.tokens_after(self.decision, after, self.last_at - self.first_at)
            with anyio.CancelScope(shield=True):
                await self.upstream.aclose()


CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 2, 120


class Gateway:
    def __init__(self, args):
        self.upstreams = [u.rstrip("/") for u in args.upstream]
        self.policy = args.policy
        self.router = pr.Router(len(self.upstreams), args.policy, block_size=args.block_size)
        config = args.tokenizer_config  # by default the one beside the tokenizer, if there
        if args.tokenizer and config is None:
            beside = args.tokenizer.parent / "tokenizer_config.json"
            config = beside if beside.exists() else None
        self.prompts = Prompts(args.tokenizer, config) if args.tokenizer else None
        self.timeout = args.request_timeout_s
        self.health_interval = args.health_interval_ms / 1000
        # No cap on connections: requests in flight are bounded by the upstreams, not by
        # the client's pool.
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
                                        limits=httpx.Limits(max_connections=None))

    def reported(self, decision, tokens, salt, cached):
        """The engine's cached tokens, fed back to the mirror (policies that keep one)."""
        if self.policy in ("balanced", "cache_aware"):
            self.router.report_cached(decision.worker, tokens, cached, cache_salt=salt)

    async def probe_forever(self):
        """A worker whose /health fails is out of routing until it answers again."""
        while True:
            for w, url in enumerate(self.upstreams):
                try:
                    up = (await self.client.get(f"{url}/health", timeout=2)).is_success
                except httpx.HTTPError:
                    up = False
                self.router.set_available(w, up)
            await asyncio.sleep(self.health_interval)

    async def read(self, request: Request, path: str) -> tuple[dict, list[int], dict]:
        """The request's body, prompt token IDs and admission targets. Raises Invalid (or a
        JSON or template error) for a 400. A text or chat prompt is tokenized on a worker
        thread: a long prompt does not stall the event loop, and with it every other
        request's relay and timers."""
        body = json.loads(await request.body())
        if not isinstance(body, dict):
            raise Invalid("the body must be a JSON object")
        chat = path == "/v1/chat/completions"
        if self.prompts is None and chat:
            raise Invalid("this gateway has no tokenizer for chat messages: start it with --tokenizer")
        if self.prompts is None:
            tokens = token_ids(body)
        else:
            tokens = await anyio.to_thread.run_sync(self.prompts.tokens, chat, body)
        if not tokens:
            raise Invalid("the prompt is empty: send at least one token")
        return body, tokens, admission(request.headers)

    async def handle(self, request: Request, path: str) -> Response:
        started = time.monotonic()
        try:
            body, tokens, targets = await self.read(request, path)
        except (Invalid, ValueError, TypeError, jinja2.TemplateError) as e:
            return error(400, str(e))
        user = body.get("user")
        session = request.headers.get("x-session-id") or (user if isinstance(user, str) else None)
        salt = body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else None
        streamed = body.get("stream") is True
        if streamed and isinstance(body.setdefault("stream_options", {}), dict):
            body["stream_options"].setdefault("include_usage", True)
        payload = json.dumps(body).encode() if streamed else await request.body()
        unreachable = None  # why the last upstream tried could not be reached
        for _ in range(2):  # one other worker when the first cannot be reached
            try:
                decision = self.router.route(tokens, session=session, cache_salt=salt, **targets)
            except pr.Shed as shed:
                return shed_response(shed)
            except pr.NoWorkers:
                break
            headers = {"x-routed-worker": str(decision.worker),
                       "x-predicted-cached-tokens": str(decision.cached_tokens)}
            try:
                upstream = await asyncio.wait_for(self.client.send(self.client.build_request(
                    "POST", self.upstreams[decision.endpoint] + path, content=payload,
                    headers={"content-type": "application/json", "accept-encoding": "identity"}),
                    stream=True), self.timeout)
            except httpx.ConnectTimeout as e:  # not accepted in time: unreachable, not slow
                unreachable = self.unreachable(decision, e)
                continue
            except (asyncio.TimeoutError, httpx.TimeoutException) as e:
                self.router.complete(decision)
                return error(504, self.timed_out(e))
            except httpx.TransportError as e:
                unreachable = self.unreachable(decision, e)
                continue
            if streamed:
                return Relay(self, decision, tokens, salt, started, upstream, headers)
            return await self.whole(decision, tokens, salt, upstream, headers)
        if unreachable is not None:
            return error(502, f"no upstream could be reached: {unreachable}")
        return error(503, "no upstream worker is available: every worker is down")

    def unreachable(self, decision, e: httpx.TransportError) -> str:
        """The decision's worker could not be reached: out of routing until its probe
        answers, the decision completed; returns why, for the client."""
        self.router.set_available(decision.worker, False)
        self.router.complete(decision)
        if isinstance(e, httpx.ConnectTimeout):
            return (f"worker {decision.worker} did not accept a connection within the connect "
                    f"timeout ({CONNECT_TIMEOUT_S} s)")
        return f"worker {decision.worker}: {type(e).__name__}: {e}"

    def timed_out(self, e: Exception) -> str:
        """The message of a 504, naming the timeout that fired."""
        if isinstance(e, httpx.ReadTimeout):
            return f"the upstream sent nothing within the read timeout ({READ_TIMEOUT_S} s)"
        if isinstance(e, httpx.TimeoutException):  # writing the request, or waiting for the pool
            return f"the upstream did not answer within the {type(e).__name__} ({READ_TIMEOUT_S} s)"
        return f"the upstream did not answer within the gateway's request timeout ({self.timeout} s)"

    async def whole(self, decision, tokens, salt, upstream, headers) -> Response:
        """A whole answer read from `upstream`; the decision is completed on leaving."""
        with decision:
            try:
                data = await asyncio.wait_for(upstream.aread(), self.timeout)
            except (asyncio.TimeoutError, httpx.TimeoutException) as e:
                return error(504, self.timed_out(e))
            except httpx.TransportError as e:
                return error(502, f"the upstream's answer broke: {e}")
            finally:
                await upstream.aclose()
            self.router.first_token(decision)
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                cached = json.loads(data)["usage"]["prompt_tokens_details"]["cached_tokens"]
                if isinstance(cached, int):
                    self.reported(decision, tokens, salt, cached)
        return Response(data, upstream.status_code, headers, media_type="application/json")

    async def health(self, _request: Request) -> JSONResponse:
        workers = self.router.fleet_signals().workers
        return JSONResponse({"status": "ok", "available_workers": sum(w.available for w in workers),
                             "workers": [{"worker": w.worker, "available": w.available,
                                          "in_flight": w.requests, "routed": w.routed}
                                         for w in workers]})


def app(gw: Gateway) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        probe = asyncio.create_task(gw.probe_forever())
        yield
        probe.cancel()
        await gw.client.aclose()

    def post(path):
        return Route(path, functools.partial(gw.handle, path=path), methods=["POST"])

    return Starlette(routes=[post("/v1/completions"), post("/v1/chat/completions"),
                             Route("/health", gw.health)], lifespan=lifespan)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", default="127.0.0.1:8000", help="address to listen on")
    p.add_argument("--upstream", action="append", required=True, help="an upstream's base URL (repeat)")
    p.add_argument("--policy", default="balanced", help="the routing policy")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block, as the engines hash")
    p.add_argument("--tokenizer", type=Path, help="the model's tokenizer.json (text and chat prompts)")
    p.add_argument("--tokenizer-config", type=Path, help="its tokenizer_config.json (chat template)")
    p.add_argument("--request-timeout-s", type=float, default=300, help="to answer, or start a stream")
    p.add_argument("--health-interval-ms", type=int, default=2000, help="between health probes")
    args = p.parse_args()
    host, _, port = args.listen.rpartition(":")
    uvicorn.run(app(Gateway(args)), host=host, port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
