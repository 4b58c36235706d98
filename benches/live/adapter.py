"""An endpoint adapter in front of one engine's OpenAI endpoint (Dynamo's frontend), serving
what the peer routers expect of a worker and Dynamo's frontend lacks, as vLLM serves it:

- the request fields sglang-router and vllm-router add to every body (SGLang's
  `return_hidden_states`, `no_stop_trim`) are dropped: Dynamo's frontend answers 400
  "Unsupported parameter(s)" where vLLM and SGLang accept them;
- `POST /tokenize` ({"prompt"} -> {"count", "max_model_len", "tokens", "token_strs"}) and
  `POST /v1/completions/render` (a completion request -> a list of one GenerateRequest with
  the prompt's `token_ids`), as vLLM's server and renderer API answer; vllm-router's
  `cache_aware` calls them before routing a text prompt;
- everything else forwarded to the engine as is (streams streamed);
- with --kv-in/--kv-out, the engine's ZMQ KV events republished with the fields vLLM's
  events carry and the mocker's lack (`lora_id`, `medium`, `lora_name`): vllm-router's `kv_aware`
  drops every batch without them ("missing KV event field: lora_id").

Every router but Dynamo's own frontend reaches the engines through these adapters, so
that every such router pays the same extra hop (benches/live.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid

import aiohttp
from aiohttp import web
from tokenizers import Tokenizer


# Fields Dynamo's frontend rejects (400) that SGLang and vLLM engines accept.
DROP = ("return_hidden_states", "no_stop_trim")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--kv-in", help="the engine's KV event socket (tcp://...)")
    p.add_argument("--kv-out", help="republish them here (tcp://127.0.0.1:PORT)")
    a = p.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    upstream = a.upstream.rstrip("/")
    session: dict = {}

    def ids(prompt) -> list[int]:
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt
        if isinstance(prompt, list):
            prompt = prompt[0]
        return tok.encode(prompt, add_special_tokens=False).ids

    async def tokenize(req: web.Request):
        body = await req.json()
        t = ids(body.get("prompt", ""))
        return web.json_response({"count": len(t), "max_model_len": a.max_model_len,
                                  "tokens": t, "token_strs": None})

    async def render(req: web.Request):
        body = await req.json()
        t = ids(body.get("prompt", ""))
        sampling = {k: body[k] for k in ("max_tokens", "temperature", "top_p") if k in body}
        return web.json_response([{"request_id": f"cmpl-{uuid.uuid4().hex}",
                                   "model": body.get("model", a.model), "token_ids": t,
                                   "sampling_params": sampling, "stream": body.get("stream", False)}])

    async def forward(req: web.Request):
        s: aiohttp.ClientSession = session["s"]
        data = await req.read()
        if req.method == "POST" and data[:1] == b"{":
            body = json.loads(data)
            if any(k in body for k in DROP):
                data = json.dumps({k: v for k, v in body.items() if k not in DROP}).encode()
        headers = {k: v for k, v in req.headers.items()
                   if k.lower() not in ("host", "content-length", "transfer-encoding")}
        async with s.request(req.method, upstream + req.path_qs, data=data, headers=headers) as r:
            out = web.StreamResponse(status=r.status)
            for k, v in r.headers.items():
                if k.lower() not in ("content-length", "transfer-encoding", "connection",
                                     "content-encoding"):
                    out.headers[k] = v
            await out.prepare(req)
            async for chunk in r.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    async def relay():
        import msgspec
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context()
        sub = ctx.socket(zmq.SUB)
        sub.connect(a.kv_in)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        pub = ctx.socket(zmq.PUB)
        pub.bind(a.kv_out)
        while True:
            parts = await sub.recv_multipart()
            batch = msgspec.msgpack.decode(parts[-1])
            for ev in batch[1] if isinstance(batch, list) and len(batch) > 1 else []:
                if isinstance(ev, dict) and ev.get("type") in ("BlockStored", "BlockRemoved"):
                    ev.setdefault("lora_id", None)
                    ev.setdefault("medium", "GPU")
                    ev.setdefault("lora_name", None)
            parts[-1] = msgspec.msgpack.encode(batch)
            await pub.send_multipart(parts)

    async def start(app):
        session["s"] = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None),
            connector=aiohttp.TCPConnector(limit=0))
        if a.kv_in and a.kv_out:
            session["relay"] = asyncio.get_running_loop().create_task(relay())

    async def stop(app):
        await session["s"].close()

    app = web.Application(client_max_size=64 << 20)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/completions/render", render)
    app.router.add_route("*", "/{tail:.*}", forward)
    host, port = a.listen.rsplit(":", 1)
    web.run_app(app, host=host, port=int(port), print=None, access_log=None)


if __name__ == "__main__":
    main()
