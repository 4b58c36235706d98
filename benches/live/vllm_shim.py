"""What vllm-router's `cache_aware` asks of a worker and Dynamo's engines lack, served as vLLM
serves it, in front of one engine's OpenAI endpoint:

- `POST /tokenize` ({"prompt"} -> {"count", "max_model_len", "tokens", "token_strs"});
- `POST /v1/completions/render` (a completion request -> a list of one GenerateRequest with
  the prompt's `token_ids`), as vLLM's renderer API answers;
- everything else forwarded to the engine as is (streams streamed).

Only vllm-router's cells go through it (an extra hop of Python; benches/live.md says so).
"""

from __future__ import annotations

import argparse
import uuid

import aiohttp
from aiohttp import web
from tokenizers import Tokenizer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--max-model-len", type=int, default=131072)
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

    async def start(app):
        session["s"] = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None),
            connector=aiohttp.TCPConnector(limit=0))

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
