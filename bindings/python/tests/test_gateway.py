"""The Python gateway example (examples/gateway.py) in front of the repository's mock workers
(examples/gateway/mock.rs), driven by the official OpenAI client as tests/python/*.py drive
the Rust gateway.

The mocks are started by the caller: PREFIX_ROUTER_MOCK_URLS names their base URLs
(comma-separated, at least two) and PREFIX_ROUTER_TOKENIZER_DIR the directory of the
tokenizer.json and tokenizer_config.json they read prompts with. Each gateway runs in a
subprocess on a free loopback port. Every prompt carries a fresh nonce, so that what the
mocks cached before (another run) is not found: the gateway's router predicts what the
mocks hold only from what it sent them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import os
import random
import socket
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path

import httpx
import openai
import pytest

GATEWAY = Path(__file__).resolve().parents[1] / "examples" / "gateway.py"
NONCE = uuid.uuid4().hex[:12]
SYSTEM = f"[{NONCE}] You are the routing test's assistant. Keep answers short and about caches."
PROMPT = f"[{NONCE}] The router sends each request to the worker that holds the longest prefix."


def required_env(name: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        pytest.fail(
            f"{name} is not set: the Rust driver test starts the mock workers "
            "(examples/gateway/mock.rs) and sets PREFIX_ROUTER_MOCK_URLS (their base URLs, "
            "comma-separated) and PREFIX_ROUTER_TOKENIZER_DIR (tests/data/tokenizer/bytelevel)",
            pytrace=False,
        )
    return value


@pytest.fixture(scope="module")
def mocks() -> list[str]:
    urls = [u.strip().rstrip("/") for u in required_env("PREFIX_ROUTER_MOCK_URLS").split(",") if u.strip()]
    if len(urls) < 2:
        pytest.fail(f"PREFIX_ROUTER_MOCK_URLS names {len(urls)} mock worker(s); give at least 2", pytrace=False)
    for url in urls:
        try:
            httpx.get(f"{url}/health", timeout=5).raise_for_status()
        except httpx.HTTPError as e:
            pytest.fail(f"the mock worker at {url} does not answer /health: {e}", pytrace=False)
    return urls


@pytest.fixture(scope="module")
def tokenizer_dir() -> Path:
    path = Path(required_env("PREFIX_ROUTER_TOKENIZER_DIR"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (path / name).is_file():
            pytest.fail(f"PREFIX_ROUTER_TOKENIZER_DIR={path} has no {name}", pytrace=False)
    return path


class Gateway:
    """examples/gateway.py in a subprocess, on a free loopback port."""

    def __init__(self, upstreams: list[str], tokenizer_dir: Path, log: Path, *flags: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        args = [sys.executable, str(GATEWAY), "--listen", f"127.0.0.1:{port}",
                "--tokenizer", str(tokenizer_dir / "tokenizer.json"),
                "--tokenizer-config", str(tokenizer_dir / "tokenizer_config.json")]
        for u in upstreams:
            args += ["--upstream", u]
        args += flags
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"the gateway exited with {self.proc.returncode}:\n{self.output()}", pytrace=False)
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        pytest.fail(f"the gateway did not answer /health within 30 s:\n{self.output()}", pytrace=False)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=20, **kw)

    def in_flight(self) -> list[int]:
        health = httpx.get(f"{self.url}/health", timeout=5).json()
        return [w["in_flight"] for w in health["workers"]]

    def wait_in_flight(self, check, within: float = 5.0) -> list[int]:
        deadline = time.monotonic() + within
        while True:
            seen = self.in_flight()
            if check(seen) or time.monotonic() > deadline:
                return seen
            time.sleep(0.02)

    def stop(self):
        print(f"the gateway's output:\n{self.output()}")  # shown when a test failed
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def gateway(mocks, tokenizer_dir, tmp_path_factory):
    gw = Gateway(mocks, tokenizer_dir, tmp_path_factory.mktemp("gw") / "gateway.log")
    yield gw
    gw.stop()


def stream_text(stream, content):
    """The streamed text and the usage chunk's usage."""
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += content(chunk.choices[0]) or ""
        if chunk.usage is not None:
            usage = chunk.usage
    return text, usage


def test_chats_and_text_completions_whole_and_streamed_find_their_prefixes(gateway):
    client = gateway.client()
    totals = {"prompt": 0, "cached": 0, "predicted": 0}
    workers: dict[int, set[int]] = {}

    def check(raw, usage, chat, turn):
        assert usage is not None and usage.prompt_tokens_details is not None, "no usage"
        cached = usage.prompt_tokens_details.cached_tokens
        totals["prompt"] += usage.prompt_tokens
        totals["cached"] += cached
        totals["predicted"] += int(raw.headers["x-predicted-cached-tokens"])
        workers.setdefault(chat, set()).add(int(raw.headers["x-routed-worker"]))
        if turn > 0:  # the earlier turns' prefix is found where they went
            assert cached > 0, f"chat {chat} turn {turn}: nothing cached ({usage})"

    for turn in range(3):
        for chat in range(6):
            messages = [{"role": "system", "content": SYSTEM}]
            for earlier in range(turn):
                messages.append({"role": "user", "content": f"Chat {chat}, question {earlier}?"})
                messages.append({"role": "assistant", "content": "ok done"})
            messages.append({"role": "user", "content": f"Chat {chat}, question {turn}?"})
            session = {"x-session-id": f"{NONCE}-{chat}"}
            if chat % 2 == 0:
                raw = client.chat.completions.with_raw_response.create(
                    model="m", messages=messages, max_tokens=2, extra_headers=session)
                answer = raw.parse()
                assert answer.choices[0].message.content == " ok done", answer
                check(raw, answer.usage, chat, turn)
            else:
                raw = client.chat.completions.with_raw_response.create(
                    model="m", messages=messages, max_tokens=2, stream=True,
                    stream_options={"include_usage": True}, extra_headers=session)
                text, usage = stream_text(raw.parse(), lambda c: c.delta.content)
                assert text == " ok done", text
                check(raw, usage, chat, turn)
    # Every turn of a conversation went to the worker that held its prefix.
    assert all(len(w) == 1 for w in workers.values()), workers

    for i in range(4):
        if i % 2 == 0:
            raw = client.completions.with_raw_response.create(model="m", prompt=PROMPT, max_tokens=2)
            answer = raw.parse()
            assert answer.choices[0].text == " ok done", answer
            check(raw, answer.usage, 100, i)
        else:
            raw = client.completions.with_raw_response.create(
                model="m", prompt=PROMPT, max_tokens=2, stream=True,
                stream_options={"include_usage": True})
            text, usage = stream_text(raw.parse(), lambda c: c.text)
            assert text == " ok done", text
            check(raw, usage, 100, i)

    assert totals["cached"] / totals["prompt"] > 0.4, totals
    # The gateway tokenizes (chat template included) as the engines do: what its router
    # predicted cached is what the engines found.
    assert totals["predicted"] == totals["cached"], totals
    seen = gateway.wait_in_flight(lambda s: not any(s))
    assert not any(seen), f"decisions left in flight: {seen}"


def test_a_prompt_too_long_for_its_target_is_refused_without_retry_after(gateway):
    client = gateway.client()
    prompt = PROMPT * 20
    with pytest.raises(openai.RateLimitError) as refused:
        client.completions.create(model="m", prompt=prompt, max_tokens=2,
                                  extra_headers={"x-ttft-target-ms": "1"})
    e = refused.value
    assert e.status_code == 429
    assert (e.type, e.code) == ("overloaded", "shed_prompt"), e.body
    assert "request shed" in str(e.message), e.message
    assert "retry-after" not in e.response.headers, "waiting cannot help a prompt that misses alone"
    answer = client.completions.create(model="m", prompt=prompt, max_tokens=2,
                                       extra_headers={"x-ttft-target-ms": "1", "x-priority": "critical"})
    assert answer.choices[0].text == " ok done", answer
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="m", prompt=prompt, max_tokens=2,
                                  extra_headers={"x-ttft-target-ms": "soon"})


OCCUPYING, OCCUPYING_TOKENS, OCCUPYING_MS = 4, 8_192, 2_000


def test_a_busy_worker_refuses_with_retry_after_then_serves(mocks, tokenizer_dir, tmp_path):
    gw = Gateway(mocks[:1], tokenizer_dir, tmp_path / "gateway.log")
    try:
        base = int(uuid.uuid4().int % 1_000_000) * 1_000

        def occupy(i):  # prompts no other shares, held by the mock OCCUPYING_MS
            tokens = list(range(base + i * 10_000, base + i * 10_000 + OCCUPYING_TOKENS))
            body = {"model": "m", "prompt": tokens, "max_tokens": 1, "mock_pause_ms": OCCUPYING_MS}
            return httpx.post(f"{gw.url}/v1/completions", json=body, timeout=20).status_code

        with concurrent.futures.ThreadPoolExecutor(OCCUPYING) as pool:
            occupying = [pool.submit(occupy, i) for i in range(OCCUPYING)]
            seen = gw.wait_in_flight(lambda s: s == [OCCUPYING])
            assert seen == [OCCUPYING], seen
            client = gw.client()
            with pytest.raises(openai.RateLimitError) as refused:
                client.completions.create(model="m", prompt=PROMPT, max_tokens=2,
                                          extra_headers={"x-ttft-target-ms": "300"})
            assert [f.result(timeout=20) for f in occupying] == [200] * OCCUPYING
        e = refused.value
        # 4 x 8,192 uncached tokens queued ahead (about 1 s of prefill), not its own prompt
        assert (e.type, e.code) == ("overloaded", "shed_queue"), e.body
        assert "request shed" in str(e.message), e.message
        retry_after = e.response.headers.get("retry-after")
        assert retry_after is not None and retry_after.isdigit() and int(retry_after) >= 1, e.response.headers
        # The worker's requests are done: the same request is served.
        answer = client.completions.create(model="m", prompt=PROMPT, max_tokens=2,
                                           extra_headers={"x-ttft-target-ms": "300"})
        assert answer.choices[0].text == " ok done", answer
        assert gw.wait_in_flight(lambda s: s == [0]) == [0]
    finally:
        gw.stop()


def test_a_client_leaving_mid_stream_completes_its_request(gateway):
    client = gateway.client()
    stream = client.completions.create(model="m", prompt=PROMPT, max_tokens=2, stream=True,
                                       extra_body={"mock_pause_ms": 5_000})
    first = next(iter(stream))
    assert first.choices[0].text == " ok"
    assert sum(gateway.in_flight()) == 1
    stream.close()  # long before the mock's stream would end
    seen = gateway.wait_in_flight(lambda s: not any(s), within=3.0)
    assert not any(seen), f"still in flight 3 s after the client left: {seen}"


SERVED_S, SLOW_S, CLIENTS, GAP_S = 40.0, 20.0, 4, 0.2


def test_admission_sees_time_pass_serving_then_refusing(mocks, tokenizer_dir, tmp_path):
    """A minute of streamed requests with both targets through the gateway, which passes its
    router no clock (the package reads time.monotonic()): first at a load the mocks and the
    gateway serve at once (four clients, each waiting 0.2 s between requests: about 20 a
    second, where the gateway alone serves over 100), where nothing is refused; then with
    every answer's decode held a second (a time per output token ten times the target), where
    the decode bound refuses."""
    gw = Gateway(mocks, tokenizer_dir, tmp_path / "gateway.log")
    headers = {"x-ttft-target-ms": "2000", "x-tpot-target-ms": "100"}

    def drive(until: float, pause_ms: int) -> tuple[int, int, set]:
        client = gw.client()
        served = refused = 0
        gates = set()
        while time.monotonic() < until:
            body = {"mock_pause_ms": pause_ms} if pause_ms else {}
            try:
                stream = client.completions.create(
                    model="m", prompt=f"{PROMPT} {uuid.uuid4().hex[:6]}", max_tokens=2,
                    stream=True, extra_headers=headers, extra_body=body)
                for _ in stream:
                    pass
                served += 1
                time.sleep(GAP_S)
            except openai.RateLimitError as e:
                refused += 1
                gates.add(e.response.headers.get("x-shed-gate"))
                time.sleep(0.05)
        return served, refused, gates

    try:
        def phase(seconds: float, pause_ms: int):
            until = time.monotonic() + seconds
            with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
                runs = [f.result() for f in [pool.submit(drive, until, pause_ms) for _ in range(CLIENTS)]]
            return (sum(r[0] for r in runs), sum(r[1] for r in runs), set().union(*(r[2] for r in runs)))

        served, refused, gates = phase(SERVED_S, 0)
        assert served > 100 and refused == 0, (served, refused, gates)
        served, refused, gates = phase(SLOW_S, 1_000)
        assert refused > 0, (served, refused)
        assert "decode_bound" in gates, gates
        assert gw.wait_in_flight(lambda s: not any(s), within=10.0) == [0, 0]
    finally:
        gw.stop()


def test_a_long_prompts_tokenization_holds_up_no_other_request(gateway):
    """A long text prompt is tokenized off the gateway's event loop: short requests sent
    while it is tokenized are answered meanwhile. The long request is refused (a bad
    x-priority, read after its prompt is tokenized) so that no mock reads it; no short one
    waits a quarter of the time it took (one that waited for the tokenization would wait
    about all of it)."""
    rng = random.Random(7)
    words = ["routing", "cache", "prefix", "worker", "token", "request", "stream", "model",
             "engine", "block", "policy", "gateway", "load", "queue", "time", "answer"]
    long = "".join(f" {rng.choice(words)}" for _ in range(400_000))
    short = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 1}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        sent = time.monotonic()
        refused = pool.submit(httpx.post, f"{gateway.url}/v1/completions", timeout=60,
                              json={"model": "m", "prompt": long}, headers={"x-priority": "never"})
        waits = []
        while not refused.done():
            began = time.monotonic()
            assert httpx.post(f"{gateway.url}/v1/completions", json=short, timeout=60).status_code == 200
            waits.append(time.monotonic() - began)
            time.sleep(0.02)
        answer = refused.result()
        answering = time.monotonic() - sent
    assert answer.status_code == 400 and "x-priority" in answer.text, answer.text
    assert max(waits) < max(answering / 4, 0.1), (max(waits), answering, waits)
    assert len(waits) >= 3, f"{len(waits)} short requests in {answering:.2f} s"


@contextlib.contextmanager
def accepting_no_connection():
    """The URL of a loopback port that neither accepts nor refuses connections: it listens
    but never accepts, and its backlog is full, so new connections' SYNs are dropped."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fill = []
    for _ in range(4):
        client = socket.socket()
        client.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            client.connect(server.getsockname())
        fill.append(client)
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        for client in fill:
            client.close()
        server.close()


def test_an_upstream_accepting_no_connection_is_unreachable_not_slow(mocks, tokenizer_dir, tmp_path):
    """An upstream that does not accept the connection within the 2-s connect timeout is
    unreachable, as one that refuses is: the request goes to the other worker (round robin
    tries the silent one first); with no other worker, a 502 names the timeout. The
    requests are sent as soon as the gateway answers, before its first health probe of the
    silent upstream has timed out."""
    with accepting_no_connection() as silent:
        gw = Gateway([silent, mocks[0]], tokenizer_dir, tmp_path / "two.log", "--policy", "round_robin")
        try:
            answer = httpx.post(f"{gw.url}/v1/completions", timeout=20,
                                json={"model": "m", "prompt": [1, 2, 3], "max_tokens": 1})
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-routed-worker"] == "1", answer.headers
            health = httpx.get(f"{gw.url}/health", timeout=5).json()
            assert [w["routed"] for w in health["workers"]] == [1, 1], health
        finally:
            gw.stop()
        gw = Gateway([silent], tokenizer_dir, tmp_path / "one.log")
        try:
            answer = httpx.post(f"{gw.url}/v1/completions", timeout=20,
                                json={"model": "m", "prompt": [1, 2, 3], "max_tokens": 1})
            assert answer.status_code == 502, answer.text
            assert "connect timeout (2 s)" in answer.json()["error"]["message"], answer.text
        finally:
            gw.stop()


def test_the_relay_counts_each_event_with_a_choice_as_a_token_even_empty():
    """vLLM sends one event per output token, and a token that ends inside a UTF-8
    character (or a skipped special token) has no text: such an event is a token all the
    same, the first of them the stream's first token. A chat's role-only first delta is
    not."""
    spec = importlib.util.spec_from_file_location("gateway_example", GATEWAY)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    firsts = []
    router = types.SimpleNamespace(first_token=lambda _decision, after: firsts.append(after))
    relay = types.SimpleNamespace(gw=types.SimpleNamespace(router=router), decision=None,
                                  started=time.monotonic(), first_at=None, last_at=None,
                                  contents=0, completion_tokens=None, cached=None)
    for line in (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
                 b'data: {"choices":[{"index":0,"delta":{"content":""}}]}',
                 b'data: {"choices":[{"index":0,"text":""}]}',
                 b'data: {"choices":[],"usage":{"completion_tokens":2}}',
                 b"data: [DONE]"):
        example.Relay.watch(relay, line)
    assert (relay.contents, len(firsts), relay.completion_tokens) == (2, 1, 2)
