"""One vLLM worker of a disaggregated (prefill/decode) fleet, over HTTP, without a GPU.

    python tests/conformance/nixl_worker.py --site DIR --role prefill|decode --engine-id ID
        [--port 0] [--side-channel-port N] [--tokenizer DIR] [--blocks N] [--exit-with-stdin]

Prints ``listening http://127.0.0.1:PORT`` on stdout once it serves, then answers:

* ``POST /v1/completions`` and ``POST /v1/chat/completions`` as vLLM's OpenAI server does
  for the requests a P/D proxy sends (whole, or streamed as server-sent events), with the
  top-level ``kv_transfer_params`` vLLM's scheduler returned when the request finished;
* ``GET /v1/models`` (one model, ``m``), ``GET /health``;
* ``GET /debug/legs``: every request it took, oldest first, each with ``role``,
  ``engine_id``, ``path``, ``x_request_id``, vLLM's ``request_id``, ``stream``,
  ``prompt_token_ids``, the ``kv_transfer_params`` it arrived with, ``status`` (and
  ``error``), and what vLLM's scheduler returned and planned for it: ``matched`` (each
  ``get_num_new_matched_tokens``: the block-aligned local hit it was given, the external
  tokens and whether they load asynchronously), ``heartbeat`` (the remote engine and
  request ``on_new_request`` registered for lease renewal), ``recv`` (each receive
  ``build_connector_meta`` planned: local block ids, ``awaiting_kvs``, and the remote
  engine id, block ids, host, port, request id and token count), ``lease_listed`` (in a
  step's ``reqs_to_send``), ``finished`` (``request_finished``'s request status,
  ``delay_free`` and block ids), ``params_returned`` (its ``kv_transfer_params``) and
  ``kv_transfer_params_answered`` (what the answer carried).

vLLM's own objects, from the wheel's sources (``setup.sh``): the ``KVCacheManager`` with
prefix caching on, its block pool and block hasher, ``Request`` and ``SamplingParams``
(``kv_transfer_params`` reach the request through ``SamplingParams.extra_args``, as vLLM's
``to_sampling_params`` puts them there), and the NIXL connector's scheduler half,
``NixlPullConnectorScheduler`` (the class ``NixlConnector`` runs in the scheduler),
with ``kv_role`` ``kv_producer`` for a prefill worker and ``kv_consumer`` for a decode
worker. The harness's ``Engine`` (``engine.py``) drives them with the calls vLLM's
``Scheduler`` makes, in its order: ``on_new_request``, the local hit
(``get_computed_blocks``), ``get_num_new_matched_tokens``, ``allocate_slots``,
``update_state_after_alloc``, ``build_connector_meta`` each step, ``request_finished``
when the request ends, ``update_connector_output`` with what the worker side reports.

What stands in for the GPU side: the model "samples" `` ok``, then `` done``, then the end
of sequence (a prefill leg, asked for one token, stops after the first); the connector's
worker half (NIXL agents, handshakes, the READ itself) is not run. A receive vLLM planned
with ``awaiting_kvs`` is reported done (``finished_recving``) in the step that planned it,
and the blocks a finished prefill holds for its reader (``reqs_to_send``) are reported sent
(``finished_sending``) in the step that lists them, as if the decode worker had read them
at once; the lease (``kv_lease_duration``) never runs out.

Requests are served one at a time, each until it finished and its blocks were freed (no
batching). A request vLLM's scheduler does not take as it
should (an exception or failed assertion in its code, a warning it logs, a remote load it
announced with no receive planned for it) is answered ``500`` with the reason and recorded
in ``/debug/legs``; it is never served quietly. Malformed HTTP input is answered ``400``.

Test knob (the worker's own, not vLLM's): a prefill leg whose body has
``"nixl_worker_drop_params": [KEY, ...]`` gets vLLM's ``kv_transfer_params`` without those
keys, so that a test can hand a decode worker parameters vLLM's scheduler must refuse.
"""

import argparse
import copy
import importlib
import json
import logging
import os
import sys
import threading
import time
import traceback
import types
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import vllm_import
from engine import Engine
from engine_config import MAX_MODEL_LEN, EngineShape

MODEL = "m"
NIXL_PACKAGE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
# The model's output: these tokens, then the end of sequence (the test tokenizer's
# ``<|im_end|>``, its eos_token). IDs in the test tokenizer's range.
OUTPUT = ((100, " ok"), (101, " done"))
EOS = 2
# Steps one request may take before the worker gives up on it (a prompt of the model's
# whole length prefills in 16 steps of 256 tokens).
MAX_STEPS = 1000


class Rejected(Exception):
    """vLLM's scheduler did not take a request as it should: answered 500."""


class BadRequest(Exception):
    """Malformed HTTP input: answered 400."""


class WarningLog(logging.Handler):
    """Collects the warnings vLLM's loggers emit while a request is served."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(f"{record.name}: {record.getMessage()}")


def load_nixl_scheduler(site):
    """Imports ``NixlPullConnectorScheduler`` without running the ``nixl`` package's
    ``__init__`` (it imports the worker half, which needs torch's model layers)."""
    importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1")
    package = types.ModuleType(NIXL_PACKAGE)
    package.__path__ = [os.path.join(site, *NIXL_PACKAGE.split("."))]
    sys.modules[NIXL_PACKAGE] = package
    return importlib.import_module(NIXL_PACKAGE + ".pull_scheduler").NixlPullConnectorScheduler


def plain(value):
    """``value`` as JSON has it (tuples as lists), for the legs and the answers."""
    return json.loads(json.dumps(value, default=list))


class Connector:
    """What vLLM's ``NixlPullConnector`` does in the scheduler role: it forwards each hook to
    its ``NixlPullConnectorScheduler`` (``nixl/connector.py``). This one also notes what the
    scheduler returned and planned, per request, in ``self.legs[request_id]``."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.legs = {}

    def _leg(self, request_id):
        return self.legs.setdefault(request_id, {})

    def on_new_request(self, request):
        self.scheduler.on_new_request(request)
        tracked = self.scheduler._heartbeat_req_engine.get(request.request_id)
        self._leg(request.request_id)["heartbeat"] = list(tracked) if tracked else None

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        ext, load_async = self.scheduler.get_num_new_matched_tokens(request, num_computed_tokens)
        self._leg(request.request_id).setdefault("matched", []).append(
            {"local_hit_tokens": num_computed_tokens, "external_tokens": ext,
             "load_async": load_async})
        return ext, load_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        meta = self.scheduler.build_connector_meta(scheduler_output)
        for request_id, m in meta.reqs_to_recv.items():
            remote = m.remote
            self._leg(request_id).setdefault("recv", []).append(plain({
                "local_block_ids": m.local_block_ids,
                "local_num_computed_blocks": m.local_num_computed_blocks,
                "awaiting_kvs": m.awaiting_kvs,
                "tp_size": m.tp_size,
                "dcp_size": m.dcp_size,
                "pp_size": m.pp_size,
                "remote": None if remote is None else {
                    "block_ids": remote.block_ids,
                    "engine_id": remote.engine_id,
                    "request_id": remote.request_id,
                    "host": remote.host,
                    "port": remote.port,
                    "num_tokens": remote.num_tokens,
                    "blocks_expiry_time": remote.blocks_expiry_time,
                    "registration_generation": remote.registration_generation,
                },
            }))
        for request_id in meta.reqs_to_send:
            self._leg(request_id)["lease_listed"] = True
        for engine_id, info in meta.heartbeat_by_engine.items():
            for remote_id in info.req_ids:
                for leg in self.legs.values():
                    if leg.get("heartbeat") == [engine_id, remote_id]:
                        leg["heartbeat_sent"] = True
        return meta

    def update_connector_output(self, connector_output):
        self.scheduler.update_connector_output(connector_output)

    def request_finished_all_groups(self, request, block_ids):
        delay_free, params = self.scheduler.request_finished(request, block_ids)
        leg = self._leg(request.request_id)
        leg["finished"] = {"status": request.status.name, "delay_free": delay_free,
                           "block_ids": plain(block_ids)}
        leg["params_returned"] = params
        return delay_free, params

    def has_pending_push_work(self):
        return self.scheduler.has_pending_push_work()

    def take_events(self):
        return ()  # KVConnectorBase_V1.take_events: the NIXL connector has none

    def shutdown(self):
        self.scheduler.shutdown()


class NixlEngine(Engine):
    """The harness's engine (``engine.py``) with the NIXL connector's worker half stood in
    for: a receive vLLM planned is reported done in the step that planned it, and blocks
    listed in ``reqs_to_send`` are reported sent in the step that lists them."""

    def _worker_side(self, meta):
        recv = {r for r, m in meta.reqs_to_recv.items() if m.awaiting_kvs}
        return self.V.KVConnectorOutput(finished_sending=set(meta.reqs_to_send),
                                        finished_recving=recv)

    def _update_from_output(self, scheduled, worker_output, ts):
        published = super()._update_from_output(scheduled, worker_output, ts)
        # Scheduler._update_from_kv_xfer_finished: blocks held for a reader are freed
        # once the worker reports them sent.
        for request_id in worker_output[1].finished_sending:
            self._free_blocks(self.requests[request_id])
        return published


class Worker:
    def __init__(self, args):
        self.role = args.role
        self.engine_id = args.engine_id
        V = vllm_import.load(args.site)
        self.V = V
        if args.side_channel_port is not None:
            # vLLM reads it when the connector is made (envs.VLLM_NIXL_SIDE_CHANNEL_PORT).
            os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(args.side_channel_port)
        self.warnings = WarningLog()
        vllm_logger = logging.getLogger("vllm")
        vllm_logger.addHandler(self.warnings)
        vllm_logger.setLevel(min(vllm_logger.level, logging.WARNING))
        vllm_logger.propagate = False

        scheduler_class = load_nixl_scheduler(args.site)
        hash_fn = V.get_hash_fn_by_name(V.CacheConfig().prefix_caching_hash_algo)
        V.kv_cache_utils.init_none_hash(hash_fn)
        shape = EngineShape(num_gpu_blocks=args.blocks)
        self.engine = NixlEngine(
            V, shape, 0, 0, f"inproc://nixl-worker/{args.engine_id}", hash_fn, self._sample, 0)
        config = self.engine.config
        config.kv_transfer_config = V.KVTransferConfig(
            kv_connector="NixlConnector",
            kv_role="kv_producer" if self.role == "prefill" else "kv_consumer",
            engine_id=args.engine_id)
        # Read by the connector's _prefill_backoff (no multi-token-prediction drafter here).
        config.num_prefill_lookahead_tokens = 0
        self.connector = Connector(scheduler_class(config, args.engine_id,
                                                   self.engine.kv_cache_config))
        self.engine.connector = self.connector
        self.finished = {}
        self.engine.on_finished = lambda r: self.finished.__setitem__(r.request_id, r)
        self.tokenizer = None
        if args.tokenizer:
            from bytelevel import Tokenizer

            self.tokenizer = Tokenizer(args.tokenizer)
        self.lock = threading.Lock()
        self.legs = []
        self.broken = None  # why the engine's state can no longer be trusted
        self.tick = 0

    @staticmethod
    def _sample(request):
        n = len(request.output_token_ids)
        return OUTPUT[n][0] if n < len(OUTPUT) else EOS

    # ------------------------------------------------------------- one request

    def prompt_tokens(self, path, body):
        if path == "/v1/chat/completions":
            if self.tokenizer is None:
                raise BadRequest("this worker has no tokenizer for chat messages")
            try:
                return self.tokenizer.encode(self.tokenizer.render_chat(body))
            except ValueError as e:
                raise BadRequest(str(e)) from None
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise BadRequest("this worker has no tokenizer for a text prompt")
            try:
                return self.tokenizer.encode(prompt)
            except ValueError as e:
                raise BadRequest(str(e)) from None
        if (isinstance(prompt, list) and prompt
                and all(isinstance(t, int) and 0 <= t < 2**32 for t in prompt)):
            return list(prompt)
        raise BadRequest('"prompt" must be text or a non-empty array of token IDs')

    def sampling_params(self, body, num_prompt_tokens, params):
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            max_tokens = MAX_MODEL_LEN - num_prompt_tokens  # vLLM's get_max_tokens
        extra_args = {"kv_transfer_params": params} if params else None
        try:
            sp = self.V.SamplingParams(max_tokens=max_tokens,
                                       min_tokens=body.get("min_tokens", 0),
                                       extra_args=extra_args)
        except (ValueError, TypeError) as e:
            raise BadRequest(f"sampling parameters: {e}") from None
        # The input processor gives the request the tokenizer's end of sequence.
        sp.update_from_generation_config({}, eos_token_id=EOS)
        return sp

    def serve(self, path, body, x_request_id, leg):
        """Runs one request through vLLM's scheduler until it finished and its blocks were
        freed; returns the request and vLLM's kv_transfer_params for the answer."""
        V, engine = self.V, self.engine
        tokens = self.prompt_tokens(path, body)
        leg["prompt_token_ids"] = tokens
        leg["prompt_tokens"] = len(tokens)
        if len(tokens) >= MAX_MODEL_LEN:
            raise BadRequest(f"the prompt is longer than the model ({MAX_MODEL_LEN} tokens)")
        params = body.get("kv_transfer_params")
        if params is not None and not isinstance(params, dict):
            raise BadRequest("kv_transfer_params must be an object")
        leg["kv_transfer_params"] = copy.deepcopy(params)
        sp = self.sampling_params(body, len(tokens), params)
        # vLLM's ids: the serving layer's cmpl-/chatcmpl-<X-Request-Id> (-<index> for
        # completions), then the engine's 8 random characters.
        base = (f"cmpl-{x_request_id}-0" if path == "/v1/completions"
                else f"chatcmpl-{x_request_id}")
        request_id = f"{base}-{uuid.uuid4().hex[:8]}"
        leg["request_id"] = request_id
        request = V.Request(request_id=request_id, prompt_token_ids=list(tokens),
                            sampling_params=sp, pooling_params=None, arrival_time=time.time(),
                            block_hasher=engine.block_hasher)
        self.warnings.records = []
        seen = self.connector._leg(request_id)
        try:
            engine.add_request(request)
            for _ in range(MAX_STEPS):
                if request_id in self.finished and request_id not in engine.requests:
                    break
                self.tick += 1
                engine.step(1_700_000_000 + self.tick * 0.05)
                if self.warnings.records:
                    raise Rejected("vLLM's scheduler warned: " + " | ".join(self.warnings.records))
                if (request.status == V.RequestStatus.WAITING_FOR_REMOTE_KVS
                        and not any(r["awaiting_kvs"] for r in seen.get("recv", []))):
                    raise Rejected(
                        "vLLM's scheduler announced a remote load of "
                        f"{seen['matched'][-1]['external_tokens']} tokens "
                        "(get_num_new_matched_tokens) but planned no receive for it: the "
                        "request would wait for its KV forever")
            else:
                raise Rejected(f"the request did not finish in {MAX_STEPS} engine steps")
        except Exception as e:
            reason = e if isinstance(e, Rejected) else Rejected(
                f"vLLM's scheduler raised {type(e).__name__}: {e}\n"
                + "".join(traceback.format_exception(e)[-4:]))
            self._abort(request)
            raise reason from None
        finally:
            leg.update(plain(seen))
        self.finished.pop(request_id, None)
        returned = seen.get("params_returned")
        if returned is not None:
            returned = plain(returned)
            matched = seen.get("matched") or [{}]
            if returned.get("do_remote_prefill"):
                # Scheduler.update_from_output: the prefill's own prefix-cache hit, so
                # that the decode worker reports it (prefill stats are on by default).
                returned["remote_prefill_cached_tokens"] = (
                    matched[0].get("local_hit_tokens", 0) + matched[0].get("external_tokens", 0))
            for key in body.get("nixl_worker_drop_params") or ():
                returned.pop(key, None)
            leg["kv_transfer_params_answered"] = returned
        return request, returned

    def _abort(self, request):
        """``Scheduler.finish_requests(FINISHED_ABORTED)`` for a request vLLM did not take,
        then its blocks freed (no transfer will be reported for it). If that fails too,
        the worker refuses every request from then on."""
        engine, rid = self.engine, request.request_id
        try:
            for queue in (engine.waiting, engine.kv_holding, engine.running):
                if request in queue:
                    queue.remove(request)
            engine.finished_recving.discard(rid)
            engine.inflight_prefills.discard(rid)
            if rid in engine.requests and not request.is_finished():
                request.status = self.V.RequestStatus.FINISHED_ABORTED
                engine._free_request(request)
            if rid in engine.requests:
                engine._free_blocks(request)
            self.finished.pop(rid, None)
        except Exception as e:  # noqa: BLE001 - the state is unknown from here on
            self.broken = f"aborting {rid} failed: {type(e).__name__}: {e}"

    # ------------------------------------------------------------- answers

    def answer(self, path, body, request, params, stream, leg):
        """vLLM's OpenAI answer (whole, or the events of a stream) and its finish reason."""
        chat = path == "/v1/chat/completions"
        x_id = ("chatcmpl-" if chat else "cmpl-") + leg["x_request_id"]
        outputs = list(request.output_token_ids)
        texts = [dict(OUTPUT).get(t, "") for t in outputs]
        finish = "stop" if request.status == self.V.RequestStatus.FINISHED_STOPPED else "length"
        # OutputProcessor: a remote prefill reports the prefill worker's cached tokens;
        # otherwise the request's own prefix hit (local plus external).
        arrived = leg.get("kv_transfer_params") or {}
        remote = arrived.get("remote_prefill_cached_tokens")
        matched = (leg.get("matched") or [{}])[0]
        cached = (remote if arrived.get("do_remote_prefill") and isinstance(remote, int)
                  else matched.get("local_hit_tokens", 0) + matched.get("external_tokens", 0))
        usage = {"prompt_tokens": request.num_prompt_tokens,
                 "completion_tokens": len(outputs),
                 "total_tokens": request.num_prompt_tokens + len(outputs),
                 "prompt_tokens_details": {"cached_tokens": cached}}
        head = {"id": x_id, "created": int(time.time()), "model": body.get("model", MODEL)}
        if not stream:
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": "".join(texts)},
                          "finish_reason": finish, "stop_reason": None}
            else:
                choice = {"index": 0, "text": "".join(texts), "logprobs": None,
                          "finish_reason": finish, "stop_reason": None}
            return {**head, "object": "chat.completion" if chat else "text_completion",
                    "choices": [choice], "usage": usage, "kv_transfer_params": params}, finish
        events = []
        kind = "chat.completion.chunk" if chat else "text_completion"
        if chat:
            events.append({**head, "object": kind, "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""},
                 "finish_reason": None}]})
        for i, text in enumerate(texts):
            last = i == len(texts) - 1
            choice = ({"index": 0, "delta": {"content": text}} if chat
                      else {"index": 0, "text": text, "logprobs": None})
            choice["finish_reason"] = finish if last else None
            event = {**head, "object": kind, "choices": [choice]}
            if last and params is not None:
                event["kv_transfer_params"] = params
            events.append(event)
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            events.append({**head, "object": kind, "choices": [], "usage": usage})
        return events, finish


def handler_class(worker):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, status, body, content_type="application/json"):
            data = body if isinstance(body, bytes) else (
                json.dumps(body) if not isinstance(body, str) else body).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status, message):
            kind = "BadRequestError" if status == 400 else "InternalServerError"
            self._send(status, {"error": {"message": message, "type": kind, "code": status}})

        def do_GET(self):
            if self.path == "/health":
                self._send(200, b"", "text/plain")
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [
                    {"id": MODEL, "object": "model", "created": 0, "owned_by": "vllm"}]})
            elif self.path == "/debug/legs":
                with worker.lock:
                    self._send(200, worker.legs)
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._error(404, f"no route {self.path}")
                return
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            if not isinstance(body, dict):
                self._error(400, "the body must be a JSON object")
                return
            if body.get("model", MODEL) != MODEL:
                self._error(404, f"the model {body.get('model')!r} does not exist")
                return
            if self.headers.get("X-data-parallel-rank", "0") != "0":
                self._error(400, "this worker has one data-parallel rank")
                return
            x_request_id = self.headers.get("X-Request-Id") or uuid.uuid4().hex
            stream = body.get("stream") is True
            leg = {"role": worker.role, "engine_id": worker.engine_id, "path": self.path,
                   "x_request_id": x_request_id, "stream": stream}
            with worker.lock:
                try:
                    if worker.broken:
                        raise Rejected(f"the engine is broken: {worker.broken}")
                    request, params = worker.serve(self.path, body, x_request_id, leg)
                    answer, finish = worker.answer(self.path, body, request, params, stream, leg)
                    leg["status"] = 200
                    leg["finish_reason"] = finish
                    leg["completion_tokens"] = len(request.output_token_ids)
                except BadRequest as e:
                    leg.update(status=400, error=str(e))
                except Rejected as e:
                    leg.update(status=500, error=str(e))
                worker.legs.append(leg)
            if leg["status"] != 200:
                self._error(leg["status"], leg["error"])
            elif not stream:
                self._send(200, answer)
            else:
                text = "".join(f"data: {json.dumps(e)}\n\n" for e in answer) + "data: [DONE]\n\n"
                self._send(200, text, "text/event-stream")

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--site", required=True, help="the wheel's unpacked .py files")
    parser.add_argument("--role", required=True, choices=("prefill", "decode"))
    parser.add_argument("--engine-id", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--side-channel-port", type=int, default=None,
                        help="VLLM_NIXL_SIDE_CHANNEL_PORT (vLLM's default: 5600)")
    parser.add_argument("--tokenizer", help="a folder with tokenizer.json and "
                        "tokenizer_config.json (tests/data/tokenizer/bytelevel)")
    parser.add_argument("--blocks", type=int, default=512, help="KV cache blocks of 16 tokens")
    parser.add_argument("--exit-with-stdin", action="store_true",
                        help="exit when stdin closes (the process that started it is gone)")
    args = parser.parse_args()
    if args.exit_with_stdin:
        threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    worker = Worker(args)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler_class(worker))
    server.daemon_threads = True
    print(f"listening http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        worker.engine.shutdown()


if __name__ == "__main__":
    main()
