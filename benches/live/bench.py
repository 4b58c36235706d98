"""The live fleet bench: N Dynamo mocker engines on 127.0.0.1, and in turn in front of them
(the fleet restarted for every run, so every router starts cold) each router of the
bake-off, replaying the same arrivals through the official OpenAI client. Run by
benches/live/run.sh, which installs what it needs; see benches/live.md.

Fleets:
- "split" (every router but Dynamo's): engine i in Dynamo namespace e<i> behind a Dynamo
  frontend of its own (one OpenAI endpoint per engine, http://127.0.0.1:<base+100+i>), and
  its vLLM-format ZMQ KV events on tcp://127.0.0.1:<base+200+i>;
- "shared" (Dynamo's frontend): the same engines in one namespace behind one frontend
  (`--router-mode kv` or `round-robin`), its KV router fed by the same events.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import client as cl  # noqa: E402
import summarise  # noqa: E402

MODEL = "live"
TOKENIZER_DIR = ROOT / "tests" / "data" / "tokenizer" / "bytelevel"
# The engines as NVIDIA's offline replay takes them (benches/live.md).
ENGINE = {"num_gpu_blocks": 65536, "block_size": 16, "max_num_seqs": 256,
          "max_num_batched_tokens": 8192, "enable_prefix_caching": True,
          "enable_chunked_prefill": True}
DYN_ENV = {
    "DYN_DISCOVERY_BACKEND": "file", "DYN_REQUEST_PLANE": "tcp", "DYN_EVENT_PLANE": "zmq",
    "DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_EVENT_PLANE_HOST": "127.0.0.1",
    "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1", "HF_HUB_OFFLINE": "1",
    "DYN_LOG": "warn", "RUST_LOG": "warn", "DYN_SELF_HOST_METADATA": "0",
}
DYN_FLAGS = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]


def log(msg: str):
    print(f"[live {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Procs:
    """Processes this bench started, each in a session of its own, ended by their ids."""

    def __init__(self, logdir: Path):
        self.logdir = logdir
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        out = open(self.logdir / f"{name}.log", "ab")
        e = dict(os.environ)
        e.update(env or {})
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=e,
                             start_new_session=True, cwd=str(ROOT))
        self.procs.append((name, p))
        return p

    def check(self):
        for name, p in self.procs:
            if p.poll() is not None:
                tail = (self.logdir / f"{name}.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"{name} exited ({p.returncode}):\n{tail}")

    def stop_all(self):
        for _, p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 10
        for _, p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self.procs = []


def get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except Exception:
        return 0, ""


def wait_until(what: str, ok, procs: Procs, timeout: float = 120.0, every: float = 0.25):
    deadline = time.time() + timeout
    while time.time() < deadline:
        procs.check()
        if ok():
            return
        time.sleep(every)
    raise RuntimeError(f"timed out waiting for {what}")


class CpuMeter:
    """The machine's busy share (all cores, /proc/stat) and 1-minute load over a run."""

    def __init__(self):
        self.loads: list[float] = []
        self._stop = threading.Event()

    @staticmethod
    def _stat():
        f = open("/proc/stat").readline().split()[1:]
        v = [int(x) for x in f]
        idle = v[3] + v[4]
        return sum(v), idle

    def __enter__(self):
        self.t0, self.i0 = self._stat()
        self._th = threading.Thread(target=self._sample, daemon=True)
        self._th.start()
        return self

    def _sample(self):
        while not self._stop.wait(1.0):
            self.loads.append(float(open("/proc/loadavg").read().split()[0]))

    def __exit__(self, *exc):
        self._stop.set()
        t1, i1 = self._stat()
        total = t1 - self.t0
        self.result = {
            "busy": (total - (i1 - self.i0)) / total if total else None,
            "cores": os.cpu_count(),
            "load1_max": max(self.loads) if self.loads else None,
        }


class Fleet:
    def __init__(self, args, procs: Procs, model_dir: Path):
        self.a = args
        self.procs = procs
        self.model_dir = model_dir
        self.base = args.port_base
        self.n = args.engines

    def kv_port(self, i):
        return self.base + 200 + i

    def fe_port(self, i):
        return self.base + 100 + i

    def engine_argv(self, i: int, namespace: str, speedup: float) -> list[str]:
        return [self.a.python, "-m", "dynamo.mocker", "--model-path", str(self.model_dir),
                "--model-name", MODEL, "--block-size", str(ENGINE["block_size"]),
                "--num-gpu-blocks-override", str(ENGINE["num_gpu_blocks"]),
                "--max-num-seqs", str(ENGINE["max_num_seqs"]),
                "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"]),
                "--enable-prefix-caching", "--enable-chunked-prefill",
                "--speedup-ratio", f"{speedup:g}", "--zmq-kv-events-ports", str(self.kv_port(i)),
                "--endpoint", f"dyn://{namespace}.backend.generate", *DYN_FLAGS]

    def start(self, shared: bool, speedup: float, tag: str) -> dict:
        """Starts the engines (and, split, one frontend each); returns the fleet's URLs."""
        kv = self.a.workdir / "dyn-kv" / tag
        shutil.rmtree(kv, ignore_errors=True)
        kv.mkdir(parents=True)
        env = dict(DYN_ENV, DYN_FILE_KV=str(kv))
        urls, workers = [], []
        for i in range(self.n):
            ns = "dyn" if shared else f"e{i}"
            self.procs.start(f"{tag}-engine{i}", self.engine_argv(i, ns, speedup), env)
            if not shared:
                self.procs.start(f"{tag}-frontend{i}", [
                    self.a.python, "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
                    "--http-port", str(self.fe_port(i)), "--router-mode", "round-robin",
                    "--namespace", ns, "--kv-cache-block-size", str(ENGINE["block_size"]),
                    *DYN_FLAGS], env)
                urls.append(f"http://127.0.0.1:{self.fe_port(i)}")
        if not shared:
            for i, u in enumerate(urls):
                def up(u=u):
                    code, body = get(u + "/health")
                    return code == 200 and '"generate"' in body and MODEL in get(u + "/v1/models")[1]
                wait_until(f"engine {i} behind {u}", up, self.procs)
                body = json.loads(get(u + "/health")[1])
                ids = {str(x["instance_id"]) for x in body["instances"]
                       if x["endpoint"] == "generate" and x["namespace"] == f"e{i}"}
                workers.append(ids.pop())
        return {"urls": urls, "workers": workers, "env": env,
                "kv": [f"tcp://127.0.0.1:{self.kv_port(i)}" for i in range(self.n)]}


def router_specs(a) -> dict:
    """Every router of the bake-off: how it starts, over which fleet."""
    gw = str(a.gateway_bin) if a.gateway_bin else None
    pygw = a.py_gateway_python
    tok = str(a.workdir / "model" / "tokenizer.json")
    port = a.port_base
    listen = f"127.0.0.1:{port}"

    def rust(policy, events=True):
        def argv(f):
            v = [gw, "--listen", listen, "--policy", policy, "--tokenizer", tok]
            for u in f["urls"]:
                v += ["--upstream", u]
            if events:
                for k in f["kv"]:
                    v += ["--kv-events", k]
            return v
        return {"fleet": "split", "argv": argv, "ready": "/ready", "needs": gw}

    def python_gw(policy):
        def argv(f):
            v = [pygw, str(ROOT / "bindings/python/examples/gateway.py"), "--listen", listen,
                 "--policy", policy, "--tokenizer", tok]
            for u in f["urls"]:
                v += ["--upstream", u]
            return v
        return {"fleet": "split", "argv": argv, "ready": "/health", "needs": pygw}

    def dynamo(mode):
        def argv(f):
            return [a.python, "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
                    "--http-port", str(port), "--router-mode", mode, "--namespace", "dyn",
                    "--kv-cache-block-size", str(ENGINE["block_size"]), *DYN_FLAGS]
        return {"fleet": "shared", "argv": argv, "ready": "/v1/models", "needs": a.python}

    def sglang(policy):
        def argv(f):
            return [a.python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                    "--port", str(port), "--policy", policy, "--worker-urls", *f["urls"]]
        return {"fleet": "split", "argv": argv, "ready": "/health", "needs": a.python}

    def vllm(policy):
        def argv(f):
            v = [a.python, "-m", "vllm_router.launch_router", "--host", "127.0.0.1",
                 "--port", str(port), "--policy", policy, "--worker-urls", *f["urls"]]
            if policy == "kv_aware":
                for u, k in zip(f["urls"], f["kv"]):
                    v += ["--kv-event-source", f"{u}={k}"]
                v += ["--kv-event-block-size", str(ENGINE["block_size"]),
                      "--kv-event-model", MODEL]
            return v
        return {"fleet": "split", "argv": argv, "ready": "/health", "needs": a.python,
                "relay_events": policy == "kv_aware"}

    return {
        "gateway balanced": rust("balanced"),
        "gateway cache_aware": rust("cache_aware"),
        "gateway round_robin": rust("round_robin"),
        "python gateway balanced": python_gw("balanced"),
        "dynamo kv": dynamo("kv"),
        "dynamo round-robin": dynamo("round-robin"),
        "sglang-router cache_aware": sglang("cache_aware"),
        "vllm-router cache_aware": vllm("cache_aware"),
        "vllm-router kv_aware": vllm("kv_aware"),
        # Not in the default run: the baseline that vllm-router's cache_aware must beat.
        "vllm-router round_robin": vllm("round_robin"),
    }


def write_model_dir(workdir: Path) -> Path:
    d = workdir / "model"
    d.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / f, d / f)
    # A small Llama-shaped config: the mocker reads the model's shape from it, not weights.
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000,
        "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 2, "intermediate_size": 128, "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16", "eos_token_id": 2, "bos_token_id": 0}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "bos_token_id": 0}))
    return d


def replay(a, trace_path: Path, load: float) -> dict:
    """NVIDIA's offline replay of the slice (round robin and Dynamo's KV router), in a
    subprocess of its own (it logs every decision)."""
    engine_args = json.dumps({"engine": ENGINE, "num_gpu_blocks_is_explicit": True})
    code = f"""
import json
from dynamo._core import run_mocker_trace_replay
out = {{}}
for mode, key in (("round_robin", "rr"), ("kv_router", "kv")):
    r = run_mocker_trace_replay([{str(trace_path)!r}], extra_engine_args=json.loads({engine_args!r}),
        num_workers={a.engines}, router_mode=mode, arrival_speedup_ratio={load!r},
        trace_block_size=512, sla_ttft_ms=2000, sla_itl_ms=100)
    s = r.summary
    out[key + "_ttft_p50"] = s["median_ttft_ms"]
    out[key + "_ttft_p99"] = s["p99_ttft_ms"]
    out[key + "_tpot_p99"] = s["p99_tpot_ms"]
    out[key + "_goodput"] = s["goodput_completed_requests"] / s["num_requests"]
    out[key + "_reused"] = s["prefix_cache_reused_ratio"]
print("REPLAY " + json.dumps(out))
"""
    env = dict(os.environ, DYN_LOG="error", RUST_LOG="error")
    p = subprocess.run([a.python, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    for line in p.stdout.splitlines():
        if line.startswith("REPLAY "):
            return json.loads(line[7:])
    raise RuntimeError(f"replay failed: {p.stderr[-2000:]}")


def run_cell(a, name: str, spec: dict, workload: dict, speedup: float, words) -> dict:
    """One router on a fresh fleet: start, replay the workload, stop."""
    tag = "run"
    procs = Procs(a.logdir)
    fleet = Fleet(a, procs, a.workdir / "model")
    t_start = time.time()
    try:
        f = fleet.start(spec["fleet"] == "shared", speedup, tag)
        if spec["fleet"] == "split":
            # Every router but Dynamo's reaches engine i through adapter i (adapter.py).
            f["engine_urls"], f["urls"] = f["urls"], []
            for i, u in enumerate(f["engine_urls"]):
                port = a.port_base + 300 + i
                argv = [a.python, str(HERE / "adapter.py"), "--listen", f"127.0.0.1:{port}",
                        "--upstream", u, "--tokenizer", str(a.workdir / "model" / "tokenizer.json"),
                        "--model", MODEL]
                if spec.get("relay_events"):
                    relay = f"tcp://127.0.0.1:{a.port_base + 400 + i}"
                    argv += ["--kv-in", f["kv"][i], "--kv-out", relay]
                    f["kv"][i] = relay
                procs.start(f"{tag}-adapter{i}", argv)
                f["urls"].append(f"http://127.0.0.1:{port}")
            for u in f["urls"]:
                wait_until(f"adapter {u}", lambda u=u: get(u + "/health")[0] == 200, procs)
        procs.start(f"{tag}-router", spec["argv"](f), f["env"])
        base = f"http://127.0.0.1:{a.port_base}"
        wait_until(f"{name} at {base}", lambda: get(base + spec["ready"])[0] == 200, procs)
        if spec["fleet"] == "shared":
            def all_seen():
                code, body = get(base + "/health")
                if code != 200:
                    return False
                ids = {str(x["instance_id"]) for x in json.loads(body).get("instances", [])
                       if x.get("endpoint") == "generate"}
                f["workers"] = sorted(ids)
                return len(ids) == a.engines
            wait_until(f"{name} seeing {a.engines} engines", all_seen, procs)
        elif name.startswith("gateway"):
            def all_up():
                code, body = get(base + "/health")
                return code == 200 and json.loads(body).get("available_workers") == a.engines
            wait_until(f"{name} seeing {a.engines} workers", all_up, procs)
        else:
            time.sleep(1.0)  # the router's first health round
        setup_s = time.time() - t_start
        log(f"{name}: fleet and router up in {setup_s:.1f} s; {workload['desc']}")

        async def go():
            c = cl.Client(base, MODEL)
            pinned = [cl.Client(u, MODEL) for u in f["urls"]] if workload.get("pin") else []
            try:
                if workload["kind"] == "trace":
                    return await cl.run_trace(c, words, workload["space"], workload["rows"],
                                              workload["load"], speedup, pinned,
                                              workload.get("pin"))
                return await cl.run_agents(c, words, workload["spec"], workload["load"], speedup)
            finally:
                for x in [c, *pinned]:
                    await x.close()

        with CpuMeter() as cpu:
            t0 = time.time()
            recs = asyncio.run(go())
            run_s = time.time() - t0
        procs.check()
        cell = {
            "router": name, "workload": workload["name"], "load": workload["load"],
            "speedup": speedup, "engines": a.engines, "requests_desc": workload["desc"],
            "workers": f["workers"], "cpu": cpu.result, "run_s": run_s, "setup_s": setup_s,
            "records": [r.__dict__ for r in recs],
        }
        m = summarise.metrics(cell)
        log(f"{name}: {run_s:.1f} s, cached {m['cached_ratio']:.3f}, TTFT p50 "
            f"{summarise.fmt(m['ttft_p50'])} p99 {summarise.fmt(m['ttft_p99'])} ms, errors "
            f"{m['errors']}, per worker {m['per_worker']}, busy {cpu.result['busy']:.2f}")
        return cell
    finally:
        procs.stop_all()


def workloads(a, words) -> list[dict]:
    out = []
    tdir = a.workdir / "traces"
    tdir.mkdir(parents=True, exist_ok=True)

    def trace(name, file, count, loads, max_output, max_blocks=None):
        rows = cl.trace_sessions(ROOT / "data" / file, count, max_output, max_blocks=max_blocks)
        path = tdir / f"{name}-{count}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        for load in loads:
            out.append({"kind": "trace", "name": name, "space": name, "rows": rows, "load": load,
                        "path": path, "desc": f"{len(rows)} requests in sampled sessions"
                        + (f", outputs capped at {max_output}" if max_output else "")
                        + (f", prompts at {max_blocks} blocks" if max_blocks else "")})

    if a.quick:
        # Prompts of 4,096 tokens at most: CI's gateway is the test profile's build, where the
        # tokenizer is not optimised (220 ms for 10k tokens).
        trace("synthetic", "mooncake_synthetic_trace.jsonl", 60, [1.0], a.max_output, 8)
        spec = cl.AgentSpec(sessions=8, turns=5, system_blocks=2, first_tokens=512)
    else:
        trace("conversation", "mooncake_conversation_trace.jsonl", a.requests, [a.load_low],
              a.max_output, a.max_blocks)
        trace("synthetic", "mooncake_synthetic_trace.jsonl", a.requests,
              [a.load_low, a.load_high], a.max_output, a.max_blocks)
        spec = cl.AgentSpec()
    out.append({"kind": "agent", "name": "agents", "spec": spec, "load": 1.0,
                "desc": f"{spec.sessions} sessions x {spec.turns} turns, "
                        f"{spec.groups} shared system prompts"})
    return out


def main():
    p = argparse.ArgumentParser(description="The live fleet bench (see benches/live.md).")
    p.add_argument("--python", required=True, help="the venv's python with ai-dynamo and the peers")
    p.add_argument("--gateway-bin", type=Path, help="the Rust gateway example's binary")
    p.add_argument("--py-gateway-python", help="a python with the prefix_router package")
    p.add_argument("--workdir", type=Path, default=ROOT / "target-live" / "live")
    p.add_argument("--out", type=Path, help="results JSON (default WORKDIR/results.json)")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--speedup", type=float, default=2.0)
    p.add_argument("--min-speedup", type=float, default=1.0)
    p.add_argument("--requests", type=int, default=120, help="trace requests per slice")
    p.add_argument("--max-output", type=int, default=256)
    p.add_argument("--max-blocks", type=int, help="cut prompts to their first N trace blocks")
    p.add_argument("--load-low", type=float, default=1.0)
    p.add_argument("--load-high", type=float, default=3.0)
    p.add_argument("--port-base", type=int, default=27000)
    p.add_argument("--routers", default="", help="comma-separated names (default: all)")
    p.add_argument("--workloads", default="",
                   help="comma-separated workload:load cells, e.g. synthetic:1,agents:1 (default: all)")
    p.add_argument("--quick", action="store_true",
                   help="CI smoke: 4 engines, ~100 requests, the gateway and Dynamo's KV router, "
                        "checked (no errors, cached tokens reported)")
    p.add_argument("--check", action="store_true", help="check every cell as --quick does")
    a = p.parse_args()
    a.workdir = a.workdir.resolve()
    a.logdir = a.workdir / "logs"
    shutil.rmtree(a.logdir, ignore_errors=True)
    a.logdir.mkdir(parents=True)
    a.out = a.out or a.workdir / "results.json"
    model_dir = write_model_dir(a.workdir)
    words = cl.Words(model_dir / "tokenizer.json")
    specs = router_specs(a)
    if a.quick:
        names = ["gateway balanced", "dynamo kv"]
    else:
        names = [n for n in specs if n != "vllm-router round_robin"]
    if a.routers:
        names = [n for n in a.routers.split(",") if n]
    for n in names:
        if n not in specs:
            raise SystemExit(f"unknown router {n!r}: {sorted(specs)}")
        if not specs[n]["needs"]:
            raise SystemExit(f"{n} needs --gateway-bin / --py-gateway-python")
    t_all = time.time()
    cells = []
    chosen = [x for x in a.workloads.split(",") if x]
    for w in workloads(a, words):
        if chosen and f"{w['name']}:{w['load']:g}" not in chosen:
            continue
        speedup = a.speedup
        check = None
        replay_out = None
        if w["kind"] == "trace":
            replay_out = replay(a, w["path"], w["load"])
            log(f"replay {w['name']} at {w['load']:g}x: {replay_out}")
        order = list(names)
        # Round robin first: it is the cell's check against the offline replay.
        rr = "gateway round_robin" if "gateway round_robin" in order else None
        if rr and w["kind"] == "trace":
            order.remove(rr)
            while True:
                cell = run_cell(a, rr, specs[rr], w, speedup, words)
                ratio = summarise.metrics(cell)["ttft_p50"] / replay_out["rr_ttft_p50"]
                bound = abs(ratio - 1.0) > 0.2
                check = {"ratio": ratio, "bound": bound, "speedup": speedup}
                log(f"round robin live/replay TTFT p50 at speedup {speedup:g}: {ratio:.2f}")
                if not bound or speedup / 2 < a.min_speedup:
                    break
                log("machine-bound: again at half the speedup")
                speedup /= 2
            cells.append(cell)
        for n in order:
            cells.append(run_cell(a, n, specs[n], w, speedup, words))
            if (n == "gateway balanced" and w["kind"] == "trace" and w["name"] == "synthetic"
                    and w["load"] == min(a.load_low, a.load_high) and not a.quick):
                # The gateway's own overhead: the same requests, each sent straight to the
                # engine (its adapter) the gateway chose, on a fresh fleet.
                routed = cells[-1]
                index = {wid: i for i, wid in enumerate(routed["workers"])}
                pin = [index.get(r["worker"], 0) for r in routed["records"]]
                direct = run_cell(a, "direct to the gateway's choices", specs[n],
                                  dict(w, pin=pin), speedup, words)
                cells.append(direct)
        for c in cells:
            if c["workload"] == w["name"] and c["load"] == w["load"]:
                c["replay"] = replay_out
                c["machine_check"] = check
        a.out.write_text(json.dumps({"cells": cells, "args": {
            k: str(v) for k, v in vars(a).items()}}, default=str))
    log(f"all done in {time.time() - t_all:.0f} s; results in {a.out}")
    print(summarise.table(cells))
    if a.check or a.quick:
        problems = summarise.check(cells, names)
        for pr in problems:
            log(f"CHECK FAILED: {pr}")
        if problems:
            sys.exit(1)
        log(f"checks passed: {len(cells)} cells, no errors, cached tokens reported in each")


if __name__ == "__main__":
    main()
