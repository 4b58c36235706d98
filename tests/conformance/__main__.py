"""Runs the conformance scenarios against vLLM's own code and writes one JSONL file each.

    python tests/conformance --site DIR --out DIR [--grid sample|full] [--members N]
        [--family NAME ...] [--scenario FAMILY-SEED ...] [--jobs N]

``--site`` holds the wheel's unpacked .py files (setup.sh makes it); run.sh
calls this with the right paths. ``scenarios.py`` lists the families and the
grids. Runs are spread over ``--jobs`` worker processes. See README.md for the
output format.
"""

import argparse
import io
import multiprocessing
import os
import sys
import time

import vllm_import
from summary import summarize

LOGICAL_EPOCH = 1_700_000_000.0  # KVEventBatch.ts = epoch + tick * TICK_SECONDS
TICK_SECONDS = 0.05
MAX_DRAIN_TICKS = 2000


def make_request(V, engine, spec, tick):
    namespace = spec.namespace
    lora_request = None
    if namespace.lora is not None:
        name, lora_id, path = namespace.lora
        lora_request = V.LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path)
    full = engine.shape.reports_full(namespace)
    extra_args = {"kv_cache_report_mode": "full"} if full else None
    return V.Request(
        request_id=spec.request_id,
        prompt_token_ids=list(spec.tokens),
        sampling_params=V.SamplingParams(max_tokens=spec.max_tokens, extra_args=extra_args),
        pooling_params=None,
        arrival_time=float(tick),
        lora_request=lora_request,
        cache_salt=namespace.cache_salt,
        block_hasher=engine.block_hasher,
    )


def engine_header(V, scenario, engine):
    """What the header says of one engine: everything it was configured with."""
    from engine_config import group_descriptions

    shape = engine.shape
    return {
        "endpoint": engine.endpoint,
        "rank": engine.rank,
        "label": shape.describe(),
        "gpu_blocks": shape.num_gpu_blocks,
        # In group index order, kinds as vLLM names them in events.
        "groups": group_descriptions(V, engine.kv_cache_config),
        "offload": None if shape.offload_blocks_per_chunk is None else {
            "chunk_blocks": shape.offload_blocks_per_chunk,
            "self_describing": shape.offload_self_describing,
            "cpu_blocks": shape.offload_cpu_blocks,
        },
        # Whether some of its requests report their prefix hit again as stores
        # (kv_cache_report_mode="full"): the mirror must be told.
        "full_reports": any(shape.reports_full(n) for n in scenario.workload.namespaces),
        "report_mode": shape.report_mode,
    }


def run_scenario(V, scenario, out_dir, hash_name, hash_fn):
    from engine import Engine
    from engine_config import BLOCK_SIZE
    from probe import probe
    from recorder import Recorder
    from workload import ChatWorkload

    started = time.monotonic()
    path = os.path.join(out_dir, f"{scenario.name}.jsonl")
    tmp = path + ".tmp"
    targets = [(e, r) for e in range(scenario.endpoints) for r in range(scenario.ranks)]
    workload = ChatWorkload(scenario.seed, len(targets), scenario.workload)
    clock = {"tick": 0}
    notes = []
    with open(tmp, "w") as out:
        recorder = Recorder(out, scenario.name, scenario.endpoints, scenario.ranks,
                            V.ZmqEventPublisher.offset_endpoint_port)
        # Subscribed before the publishers bind (recorder.py explains why).
        recorder.connect()
        engines = []
        try:
            for e, r in targets:
                engines.append(Engine(V, scenario.engine(e), e, r,
                                      recorder.publisher_endpoint(e), hash_fn,
                                      workload.next_token, seed=f"{scenario.seed}/{e}/{r}"))
            recorder.check_publishers(engines)
            for engine in engines:
                engine.on_finished = lambda request: workload.finished(clock["tick"], request)
            recorder.header({
                "scenario": scenario.name,
                "family": scenario.family,
                "member": scenario.member,
                "seed": scenario.seed,
                "vllm_version": V.version,
                "block_size": BLOCK_SIZE,
                "endpoints": scenario.endpoints,
                "ranks": scenario.ranks,
                "engines": [engine_header(V, scenario, engine) for engine in engines],
                "resets": [vars(reset) for reset in scenario.resets],
                "hash": hash_name,
            })

            def step_all(tick):
                ts = LOGICAL_EPOCH + tick * TICK_SECONDS
                for engine in engines:
                    with vllm_import.counting():
                        published = engine.step(ts)
                    if published:
                        recorder.note_published(engine.endpoint, engine.rank)

            def probe_round():
                recorder.sync()
                for spec in workload.probes(scenario.probes_per_round):
                    ns = spec.namespace
                    for engine in engines:
                        with vllm_import.counting():
                            device, external, pending = probe(V, engine, spec.tokens,
                                                              ns.lora, ns.cache_salt)
                        line = {
                            "id": recorder.probes,
                            "endpoint": engine.endpoint,
                            "rank": engine.rank,
                            "probe_kind": spec.kind,
                            "tokens": spec.tokens,
                            "lora_name": ns.lora_name,
                            "cache_salt": ns.cache_salt,
                            "device_hit_tokens": device,
                            "external_hit_tokens": external,
                            "hit_tokens": device + external,
                        }
                        if engine.connector is not None:
                            line["external_pending"] = pending
                        recorder.probe(line)

            pending_resets = sorted(scenario.resets, key=lambda r: r.tick)
            for tick in range(scenario.ticks):
                clock["tick"] = tick
                for reset in [r for r in pending_resets if tick >= r.tick]:
                    # Between steps, like the engine's utility call, and only on an
                    # engine that steps this tick, so its AllBlocksCleared is
                    # published before the next probe.
                    engine = engines[targets.index((reset.endpoint, reset.rank))]
                    if engine.can_reset() and engine.num_unfinished():
                        # The batches published before the reset come before its line.
                        recorder.sync()
                        with vllm_import.counting():
                            engine.reset_prefix_cache(reset.reset_connector)
                        recorder.reset({"endpoint": reset.endpoint, "rank": reset.rank,
                                        "reset_connector": reset.reset_connector,
                                        "offload": engine.connector is not None})
                        notes.append(f"reset_prefix_cache(reset_running_requests=True, "
                                     f"reset_connector={reset.reset_connector}) on endpoint "
                                     f"{reset.endpoint} rank {reset.rank} before tick {tick}")
                        pending_resets.remove(reset)
                inflight = [engine.num_unfinished() for engine in engines]
                for spec in workload.arrivals(tick, inflight):
                    engine = engines[spec.target]
                    with vllm_import.counting():
                        engine.add_request(make_request(V, engine, spec, tick))
                step_all(tick)
                if tick % scenario.probe_every == scenario.probe_every - 1:
                    probe_round()
            if pending_resets:
                raise RuntimeError("a scheduled prefix-cache reset never happened")
            # Let every request finish, then probe the settled caches once more.
            for tick in range(scenario.ticks, scenario.ticks + MAX_DRAIN_TICKS):
                clock["tick"] = tick
                if not any(engine.has_requests() for engine in engines):
                    break
                step_all(tick)
            else:
                raise RuntimeError("engines did not drain")
            probe_round()
            recorder.end()
        finally:
            for engine in engines:
                engine.shutdown()
            recorder.close()
    os.replace(tmp, path)
    counts = {}
    for engine in engines:
        for key, value in engine.counts.items():
            counts[key] = counts.get(key, 0) + value
    lines = [f"{scenario.name}: {' | '.join(s.describe() for s in scenario.engines)}"
             f"{' x%d ranks' % scenario.ranks if scenario.ranks > 1 else ''}: "
             f"{recorder.batches} batches, {recorder.probes} probes, "
             f"{len(workload.sessions)} sessions, engine totals {counts}, "
             f"{time.monotonic() - started:.1f}s"]
    lines += [f"  {note}" for note in notes]
    if vllm_import.TOUCHES:
        lines.append(f"  stand-ins used while driving: {dict(vllm_import.TOUCHES)}")
    return path, "\n".join(lines), dict(vllm_import.TOUCHES)


# Set in each worker process before it runs scenarios (see main).
_WORKER = {}


def _init_worker(site):
    V = vllm_import.load(site)
    hash_name = V.CacheConfig().prefix_caching_hash_algo
    hash_fn = V.get_hash_fn_by_name(hash_name)
    V.kv_cache_utils.init_none_hash(hash_fn)
    _WORKER.update(V=V, hash_name=hash_name, hash_fn=hash_fn)


def _run(args):
    scenario, out_dir = args
    w = _WORKER
    vllm_import.TOUCHES.clear()
    try:
        path, lines, touches = run_scenario(w["V"], scenario, out_dir, w["hash_name"],
                                            w["hash_fn"])
        summary = io.StringIO()
        summarize(path, summary)
        return path, lines, touches, summary.getvalue()
    except Exception as e:
        shapes = " | ".join(s.describe() for s in scenario.engines)
        raise RuntimeError(f"{scenario.name} ({shapes}): {e}") from e


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--grid", default="sample", help="sample (CI's) or full")
    parser.add_argument("--members", type=int, default=None,
                        help="members of every family (overrides --grid's count)")
    parser.add_argument("--family", action="append", default=[],
                        help="only these families (repeatable)")
    parser.add_argument("--scenario", action="append", default=[],
                        help="only these runs, by name (FAMILY-SEED; repeatable)")
    parser.add_argument("--jobs", type=int, default=0,
                        help="worker processes (default: the CPUs this process may use)")
    args = parser.parse_args()

    from scenarios import members

    chosen = members(args.grid, args.members)
    if args.family:
        chosen = [s for s in chosen if s.family in args.family]
    if args.scenario:
        chosen = [s for s in chosen if s.name in args.scenario]
    if not chosen:
        raise SystemExit("no scenario chosen")
    os.makedirs(args.out, exist_ok=True)
    jobs = args.jobs or len(os.sched_getaffinity(0))
    jobs = max(1, min(jobs, len(chosen)))
    started = time.monotonic()
    work = [(scenario, args.out) for scenario in chosen]
    if jobs == 1:
        _init_worker(args.site)
        results = [_run(item) for item in work]
    else:
        # Forked before any engine, publisher thread or ZMQ context exists: each
        # worker loads vLLM and makes its own zmq.Context.instance().
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(jobs, initializer=_init_worker, initargs=(args.site,)) as pool:
            results = pool.map(_run, work, chunksize=1)
    touches = {}
    for _, lines, used, _ in results:
        print(lines, file=sys.stderr)
        for name, count in used.items():
            touches[name] = touches.get(name, 0) + count
    print(f"{len(results)} runs in {time.monotonic() - started:.1f}s on {jobs} processes; "
          f"stand-ins for {', '.join(vllm_import.STUBBED)} used while driving: "
          f"{touches or 'none'}", file=sys.stderr)
    for _, _, _, summary in results:
        sys.stderr.write(summary)


if __name__ == "__main__":
    main()
