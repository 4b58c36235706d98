"""vLLM's own prefix-cache hit for a probe prompt, taken without changing the engine.

A probe is a fresh ``Request`` (vLLM's class, hashed by the engine's block
hasher) that is never scheduled:

* device hit: ``kv_cache_manager.get_computed_blocks(request)[1]``, the number of
  computed tokens the scheduler would adopt for it. With the request's default
  ``kv_cache_report_mode`` ("incremental") and ``log_stats=False`` this call only
  reads the block pool.
* external hit (offloading engines): the connector sees the probe the way it sees
  a new request, ``on_new_request`` then ``get_num_new_matched_tokens(request,
  device_hit)``, as ``Scheduler.schedule`` calls them. Those calls leave three
  traces, which are undone afterwards: the probe's ``RequestOffloadState`` (removed
  from ``_req_status``), the step-scoped manager lock that
  ``get_num_new_matched_tokens`` opens and ``build_connector_meta`` would close
  (closed with ``_release_step``), and the self-describing events tracker's
  payload snapshot for each CPU hit (``record_lookup``; restored to its previous
  contents). The connector's lookup-latency histogram also records the probe;
  it feeds only Prometheus metrics and is left as is.
* pending chunks: a CPU chunk whose store the worker has not reported yet is
  ``LookupResult.HIT_PENDING``; vLLM's lookup defers the request
  (``get_num_new_matched_tokens`` returns None) until the store completes, and
  no event says a store has begun. For such a probe the call is repeated with
  the CPU manager's ``lookup`` answering MISS for HIT_PENDING (every other
  answer unchanged), which gives the hit from the chunks stored so far (what
  the published events can tell), and the probe is marked ``external_pending``.

Every probe compares a fingerprint of the engine's cache state before and after
and raises if anything else changed.
"""

import itertools

_probe_ids = itertools.count()


def fingerprint(engine):
    pool = engine.kv.block_pool
    state = [
        tuple((b.block_id, b.ref_cnt, b.block_hash, b.block_hash_num_tokens) for b in pool.blocks),
        tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks()),
        len(pool.cached_block_hash_to_block),
        len(pool.kv_event_queue),
    ]
    if engine.connector is not None:
        sched = engine.connector.connector_scheduler
        manager = sched.manager
        policy = manager._policy
        state += [
            tuple(sorted((k, c.chunk_id, c.ref_cnt) for k, c in policy.chunks.items())),
            tuple(sorted(getattr(policy, "_ranks", {}).items())),
            tuple(sorted(getattr(policy, "_evictable", ()))),
            len(getattr(policy, "_heap", ())),
            tuple(manager._free_list),
            manager._num_allocated_chunks,
            len(manager.events or ()),
            tuple(sorted(sched._req_status)),
            tuple(sorted(sched._jobs)),
            tuple(sorted(sched._chunks_being_loaded or ())),
            tuple(sorted(sched._current_batch_sync_loads)),
            sched._step_region is None,
            tuple(sorted((k, tuple(sorted(map(str, m.active_residencies))))
                         for k, m in sched._events_tracker._pending_event_metadata.items())),
        ]
    return state


def make_request(V, engine, tokens, lora, cache_salt):
    lora_request = None
    if lora is not None:
        name, lora_id, path = lora
        lora_request = V.LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path)
    return V.Request(
        request_id=f"probe-{next(_probe_ids)}",
        prompt_token_ids=list(tokens),
        sampling_params=V.SamplingParams(max_tokens=1),
        pooling_params=None,
        arrival_time=0.0,
        lora_request=lora_request,
        cache_salt=cache_salt,
        block_hasher=engine.block_hasher,
    )


def probe(V, engine, tokens, lora, cache_salt):
    """Returns (device_hit_tokens, external_hit_tokens, external_pending)."""
    before = fingerprint(engine)
    request = make_request(V, engine, tokens, lora, cache_salt)
    _, device_hit, _ = engine.kv.get_computed_blocks(request)
    external_hit, pending = 0, False
    if engine.connector is not None:
        external_hit = _external_hit(engine, request, device_hit, pending_reads_as_miss=False)
        if external_hit is None:
            pending = True
            external_hit = _external_hit(engine, request, device_hit, pending_reads_as_miss=True)
        if external_hit is None:
            raise RuntimeError("the connector deferred a probe lookup for another reason")
    after = fingerprint(engine)
    if before != after:
        raise RuntimeError(f"probing changed engine {engine.endpoint}/{engine.rank}'s cache state")
    return device_hit, external_hit, pending


def _external_hit(engine, request, device_hit, pending_reads_as_miss):
    """``get_num_new_matched_tokens`` for a new request, undone afterwards."""
    sched = engine.connector.connector_scheduler
    manager = sched.manager
    tracker = sched._events_tracker._pending_event_metadata
    saved = {key: (meta, set(meta.active_residencies)) for key, meta in tracker.items()}
    if pending_reads_as_miss:
        lookup = manager.lookup

        def lookup_pending_as_miss(key, req_context):
            result = lookup(key, req_context)
            answers = type(result)
            return answers.MISS if result is answers.HIT_PENDING else result

        manager.lookup = lookup_pending_as_miss
    engine.connector.on_new_request(request)
    try:
        external_hit, _ = engine.connector.get_num_new_matched_tokens(request, device_hit)
    finally:
        if pending_reads_as_miss:
            del manager.lookup
        del sched._req_status[request.request_id]
        sched._release_step()
        for key in list(tracker):
            if key not in saved:
                del tracker[key]
        for key, (meta, residencies) in saved.items():
            meta.active_residencies.clear()
            meta.active_residencies.update(residencies)
            tracker[key] = meta
    return external_hit
