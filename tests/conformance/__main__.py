"""Runs the conformance scenarios against vLLM's own code and writes one JSONL file each.

    python tests/conformance --site DIR --out DIR [--scenario NAME ...]

``--site`` holds the wheel's unpacked .py files (setup.sh makes it); run.sh
calls this with the right paths. See README.md for the output format.
"""

import argparse
import os
import sys
import time

import vllm_import

LOGICAL_EPOCH = 1_700_000_000.0  # KVEventBatch.ts = epoch + tick * TICK_SECONDS
TICK_SECONDS = 0.05
MAX_DRAIN_TICKS = 2000


def make_request(V, engine, spec, tick):
    namespace = spec.namespace
    lora_request = None
    if namespace.lora is not None:
        name, lora_id, path = namespace.lora
        lora_request = V.LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path)
    extra_args = {"kv_cache_report_mode": "full"} if namespace.report_full else None
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


def run_scenario(V, scenario, out_dir, hash_name, hash_fn):
    from engine import Engine
    from engine_config import BLOCK_SIZE, group_descriptions
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
                engines.append(Engine(V, scenario.engine, e, r, recorder.publisher_endpoint(e),
                                      hash_fn, workload.next_token,
                                      seed=f"{scenario.seed}/{e}/{r}"))
            recorder.check_publishers(engines)
            for engine in engines:
                engine.on_finished = lambda request: workload.finished(clock["tick"], request)
            shape = scenario.engine
            recorder.header({
                "scenario": scenario.name,
                "vllm_version": V.version,
                "block_size": BLOCK_SIZE,
                "endpoints": scenario.endpoints,
                "ranks": scenario.ranks,
                "groups": group_descriptions(V, engines[0].kv_cache_config),
                "offload": None if shape.offload_blocks_per_chunk is None else {
                    "chunk_blocks": shape.offload_blocks_per_chunk,
                    "self_describing": shape.offload_self_describing,
                },
                "hash": hash_name,
                # Whether some requests report their prefix hit again as stores
                # (kv_cache_report_mode="full"): the mirror must be told.
                "full_reports": any(n.report_full for n in scenario.workload.namespaces),
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

            reset = scenario.reset
            for tick in range(scenario.ticks):
                clock["tick"] = tick
                if reset is not None and tick >= reset.tick:
                    # Between steps, like the engine's utility call, and only on an
                    # engine that steps this tick, so its AllBlocksCleared is
                    # published before the next probe.
                    engine = engines[targets.index((reset.endpoint, reset.rank))]
                    if engine.can_reset() and engine.num_unfinished():
                        with vllm_import.counting():
                            engine.reset_prefix_cache(reset.reset_connector)
                        notes.append(f"reset_prefix_cache(reset_running_requests=True, "
                                     f"reset_connector={reset.reset_connector}) on endpoint "
                                     f"{reset.endpoint} rank {reset.rank} before tick {tick}")
                        reset = None
                inflight = [engine.num_unfinished() for engine in engines]
                for spec in workload.arrivals(tick, inflight):
                    engine = engines[spec.target]
                    with vllm_import.counting():
                        engine.add_request(make_request(V, engine, spec, tick))
                step_all(tick)
                if tick % scenario.probe_every == scenario.probe_every - 1:
                    probe_round()
            if reset is not None:
                raise RuntimeError("the scheduled prefix-cache reset never happened")
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
    print(f"{scenario.name}: {recorder.batches} batches, {recorder.probes} probes, "
          f"{len(workload.sessions)} sessions, engine totals {counts}, "
          f"{time.monotonic() - started:.1f}s", file=sys.stderr)
    for note in notes:
        print(f"  {note}", file=sys.stderr)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenario", action="append", default=[])
    args = parser.parse_args()

    V = vllm_import.load(args.site)
    from scenarios import BY_NAME, SCENARIOS
    from summary import summarize

    hash_name = V.CacheConfig().prefix_caching_hash_algo
    hash_fn = V.get_hash_fn_by_name(hash_name)
    V.kv_cache_utils.init_none_hash(hash_fn)

    chosen = [BY_NAME[name] for name in args.scenario] if args.scenario else list(SCENARIOS)
    os.makedirs(args.out, exist_ok=True)
    paths = [run_scenario(V, scenario, args.out, hash_name, hash_fn) for scenario in chosen]
    print(f"stand-ins for {', '.join(vllm_import.STUBBED)} used while driving: "
          f"{dict(vllm_import.TOUCHES) or 'none'}", file=sys.stderr)
    for path in paths:
        summarize(path, sys.stderr)


if __name__ == "__main__":
    main()
