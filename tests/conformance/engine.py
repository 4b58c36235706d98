"""One modelled vLLM engine: one data-parallel rank of one endpoint.

Everything that holds or changes cache state is vLLM's own object: the
``KVCacheManager`` (with its coordinator, single-type managers and block pool),
the request block hasher, the ``OffloadingConnector`` in the scheduler role with
its CPU offloading manager, and the ``ZmqEventPublisher`` made by
``EventPublisherFactory`` from the engine's ``KVEventsConfig``.

What this module writes itself is the driver: it makes the calls
``vllm.v1.core.sched.scheduler.Scheduler`` makes, in the same order, for the features
the scenarios use (FCFS, chunked prefill, preemption, async connector loads, no
speculative decoding, no multimodal inputs, synchronous scheduling), and a
stand-in for the model runner and the connector's worker side:

* schedule(): running requests first (``allocate_slots``, preempting the last
  running request when the pool is full), then waiting ones (``get_computed_blocks``
  -> connector ``get_num_new_matched_tokens`` -> ``allocate_slots`` with
  ``full_sequence_must_fit`` -> connector ``update_state_after_alloc``), then a
  ``SchedulerOutput`` for the connector's ``build_connector_meta``, then
  ``num_computed_tokens`` advances;
* the model runner samples the workload's next token for each request whose
  prefill is complete; the connector's worker side reports finished transfers
  the way ``OffloadingConnectorWorker`` and the CPU transfer handlers do
  (``_worker_side`` below), as ``OffloadingWorkerMetadata.completed_jobs`` plus
  ``finished_recving`` for async loads;
* update_from_output(): ``check_stop``, frees finished requests the way
  ``Scheduler._free_request`` does, hands the connector output to
  ``update_connector_output``, then takes ``kv_cache_manager.take_events()`` and
  the connector's ``take_events()`` and publishes them as one ``KVEventBatch``.

The batch's ``ts`` is a logical clock supplied by the caller (vLLM uses
``time.time()``), so two runs publish byte-identical payloads.
"""

import random

from engine_config import MAX_MODEL_LEN, make_vllm_config, plan_kv_cache, set_cpu_capacity


class Engine:
    def __init__(self, V, shape, endpoint, rank, event_endpoint, hash_fn, sampler, seed):
        self.V = V
        self.shape = shape
        self.endpoint = endpoint
        self.rank = rank
        self.sampler = sampler  # request -> next output token id
        self.config = make_vllm_config(
            V, shape, rank, f"conformance-e{endpoint}-r{rank}", event_endpoint)
        self.kv_cache_config, self.block_size, hash_block_size = plan_kv_cache(
            V, self.config, shape)
        self.kv = V.KVCacheManager(
            kv_cache_config=self.kv_cache_config,
            max_model_len=MAX_MODEL_LEN,
            max_in_flight_tokens=self.config.max_in_flight_tokens,
            enable_caching=self.config.cache_config.enable_prefix_caching,
            use_eagle=False,
            num_hash_lookahead_tokens=0,
            num_prefill_lookahead=0,
            log_stats=False,
            enable_kv_cache_events=True,
            dcp_world_size=1,
            pcp_world_size=1,
            scheduler_block_size=self.block_size,
            hash_block_size=hash_block_size,
            metrics_collector=None,
            watermark=self.config.scheduler_config.watermark,
        )
        self.block_hasher = V.kv_cache_utils.get_request_block_hasher(
            hash_block_size, hash_fn, self.config.num_hash_lookahead_tokens)
        self.connector = None
        if shape.offload_blocks_per_chunk is not None:
            set_cpu_capacity(self.config, self.kv_cache_config, shape)
            self.connector = V.OffloadingConnector(
                self.config, V.KVConnectorRole.SCHEDULER, self.kv_cache_config)
            self.connector.bind_kv_cache_manager(self.kv)
        self.publisher = V.kv_events.EventPublisherFactory.create(
            self.config.kv_events_config, self.config.parallel_config.data_parallel_index)

        self.requests = {}
        self.waiting = []  # FCFS; preempted requests go back to the front
        self.kv_holding = []  # waiting requests that hold blocks (async loads)
        self.running = []
        self.finished_req_ids = set()  # finished since the last schedule()
        self.preempted_req_ids = set()  # preempted since the last schedule()
        self.finished_recving = set()  # loads the worker side reported done
        self.prev_step_scheduled = set()
        self.inflight_prefills = set()
        self.num_published = 0
        # Store jobs the worker side has not reported yet, [job_id, step it is
        # reported in], in the order the worker submits them.
        self.pending_stores = []
        self.store_delays = random.Random(f"store-delays/{seed}")
        self.on_finished = None  # callback(request), set by the scenario runner
        self.counts = {"steps": 0, "preemptions": 0, "loads": 0, "stores": 0, "flushed_stores": 0,
                       "resets": 0}

    # ----------------------------------------------------------- requests

    def add_request(self, request):
        """``Scheduler.add_request`` for a plain (non-streaming) request."""
        assert request.request_id not in self.requests
        self.requests[request.request_id] = request
        self.waiting.append(request)
        if self.connector is not None:
            self.connector.on_new_request(request)

    def num_unfinished(self):
        return len(self.waiting) + len(self.kv_holding) + len(self.running)

    def has_requests(self):
        """``Scheduler.has_requests``: keeps stepping while the connector has work."""
        if self.num_unfinished() or self.finished_req_ids:
            return True
        return self.connector is not None and self.connector.has_pending_push_work()

    # ----------------------------------------------------------- one engine step

    def step(self, ts):
        """``EngineCore.step``; returns the number of batches published (0 or 1)."""
        if not self.has_requests():
            return 0
        self.counts["steps"] += 1
        scheduled = self._schedule()
        worker_output = self._run_model_and_transfers(scheduled)
        return self._update_from_output(scheduled, worker_output, ts)

    def _schedule(self):
        V, kv = self.V, self.kv
        RS = V.RequestStatus
        kv.new_step_starts()
        budget = self.shape.max_num_batched_tokens
        new_reqs, resumed_reqs, running_reqs, preempted = [], [], [], []
        req_to_new_blocks = {}
        num_scheduled = {}

        # Running requests first.
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = request.num_tokens_with_spec - request.num_computed_tokens
            num_new = min(num_new, budget, MAX_MODEL_LEN - request.num_computed_tokens - 1)
            if num_new <= 0:
                index += 1
                continue
            while True:
                new_blocks = kv.allocate_slots(request, num_new, num_lookahead_tokens=0)
                if new_blocks is not None:
                    break
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                break
            running_reqs.append(request)
            req_to_new_blocks[request.request_id] = new_blocks
            num_scheduled[request.request_id] = num_new
            budget -= num_new
            index += 1

        # Then waiting requests, those holding blocks first.
        if not preempted:
            skipped_holding, skipped_waiting = [], []
            while budget > 0 and len(self.running) < self.shape.max_num_seqs:
                queue = self.kv_holding if self.kv_holding else self.waiting
                if not queue:
                    break
                request = queue[0]
                request_id = request.request_id
                if request.status == RS.WAITING_FOR_REMOTE_KVS:
                    if request_id not in self.finished_recving:
                        skipped_holding.append(queue.pop(0))
                        continue
                    self._update_waiting_for_remote_kv(request)
                    request.status = RS.PREEMPTED if request.num_preemptions else RS.WAITING

                num_external = 0
                load_async = False
                if request.num_computed_tokens == 0:
                    computed_blocks, num_local, request.shared_prefix_boundary = (
                        kv.get_computed_blocks(request))
                    if self.connector is not None:
                        # Hits are block-aligned here (no sub-block hash hits).
                        assert num_local % self.block_size == 0, num_local
                        num_external, load_async = self.connector.get_num_new_matched_tokens(
                            request, num_local)
                        if request.skip_reading_prefix_cache:
                            num_external, load_async = 0, False
                        if num_external is None:
                            skipped_waiting.append(queue.pop(0))
                            continue
                    num_computed = num_local + num_external
                    assert num_computed <= request.num_tokens
                else:
                    computed_blocks = kv.empty_kv_cache_blocks
                    num_local = 0
                    num_computed = request.num_computed_tokens

                if load_async:
                    num_new = 0
                else:
                    num_new = min(request.num_tokens - num_computed, budget)
                    assert num_new > 0
                reserved = self._inflight_prefill_reserved_blocks() if load_async else 0
                new_blocks = kv.allocate_slots(
                    request,
                    num_new,
                    num_new_computed_tokens=num_local,
                    new_computed_blocks=computed_blocks,
                    num_lookahead_tokens=0,
                    num_external_computed_tokens=num_external,
                    delay_cache_blocks=load_async,
                    full_sequence_must_fit=self.config.scheduler_config.scheduler_reserve_full_isl,
                    reserved_blocks=reserved,
                    has_scheduled_reqs=bool(self.running),
                )
                if new_blocks is None:
                    break
                if self.connector is not None:
                    self.connector.update_state_after_alloc(
                        request, kv.get_blocks(request_id), num_external)
                if load_async:
                    # The load runs between steps; the request waits for it.
                    request.status = RS.WAITING_FOR_REMOTE_KVS
                    request.num_computed_tokens = num_computed
                    self.inflight_prefills.add(request_id)
                    queue.pop(0)
                    skipped_holding.append(request)
                    self.counts["loads"] += 1
                    continue
                queue.pop(0)
                self.running.append(request)
                if request.status == RS.WAITING:
                    new_reqs.append(request)
                elif request.status == RS.PREEMPTED:
                    resumed_reqs.append(request)
                else:
                    raise RuntimeError(f"unexpected status {request.status}")
                req_to_new_blocks[request_id] = kv.get_blocks(request_id)
                num_scheduled[request_id] = num_new
                budget -= num_new
                request.status = RS.RUNNING
                request.num_computed_tokens = num_computed
                if num_computed + num_new < request.num_tokens:
                    self.inflight_prefills.add(request_id)
            self.kv_holding[0:0] = skipped_holding
            self.waiting[0:0] = skipped_waiting

        scheduler_output = self._scheduler_output(
            new_reqs, resumed_reqs, running_reqs, req_to_new_blocks, num_scheduled)
        meta = None
        if self.connector is not None:
            meta = self.connector.build_connector_meta(scheduler_output)
        self.prev_step_scheduled = set(num_scheduled)
        self._update_after_schedule(num_scheduled)
        return num_scheduled, meta

    def _scheduler_output(self, new_reqs, resumed_reqs, running_reqs, req_to_new_blocks,
                          num_scheduled):
        """``SchedulerOutput`` as ``Scheduler.schedule`` builds it (V1 model runner)."""
        V = self.V
        new_reqs_data = [
            V.NewRequestData.from_request(
                request, req_to_new_blocks[request.request_id].get_block_ids())
            for request in new_reqs
        ]
        req_ids, new_block_ids, num_computed, num_output = [], [], [], []
        all_token_ids, resumed_ids = {}, set()
        for index, request in enumerate(running_reqs + resumed_reqs):
            request_id = request.request_id
            req_ids.append(request_id)
            if index >= len(running_reqs):
                resumed_ids.add(request_id)
            if request_id not in self.prev_step_scheduled:
                all_token_ids[request_id] = request.all_token_ids.copy()
            new_block_ids.append(req_to_new_blocks[request_id].get_block_ids(allow_none=True))
            num_computed.append(request.num_computed_tokens)
            num_output.append(request.num_output_tokens + request.num_output_placeholders)
        cached = V.CachedRequestData(
            req_ids=req_ids, resumed_req_ids=resumed_ids, new_token_ids=[],
            all_token_ids=all_token_ids, new_block_ids=new_block_ids,
            num_computed_tokens=num_computed, num_output_tokens=num_output)
        block_state = None
        boundary_state_offloads = self.kv.take_boundary_state_offloads()
        if self.connector is not None:
            block_state_req_ids = set(num_scheduled)
            block_state_req_ids.update(
                r for r in boundary_state_offloads if r in self.requests)
            block_state = V.KVConnectorBlockState(
                req_ids=block_state_req_ids,
                resolve_block_ids=self.kv.get_block_ids,
                boundary_state_offloads=boundary_state_offloads)
        output = V.SchedulerOutput(
            scheduled_new_reqs=new_reqs_data,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={},
            finished_req_ids=self.finished_req_ids,
            free_encoder_mm_hashes=[],
            preempted_req_ids=self.preempted_req_ids,
            kv_connector_block_state=block_state,
        )
        return output

    def _update_after_schedule(self, num_scheduled):
        for request_id, num in num_scheduled.items():
            request = self.requests[request_id]
            request.num_computed_tokens += num
            request.num_in_flight_tokens += num
            request.is_prefill_chunk = request.num_computed_tokens < (
                request.num_tokens + request.num_output_placeholders)
            if not request.is_prefill_chunk:
                self.inflight_prefills.discard(request_id)
        self.finished_req_ids = set()
        self.preempted_req_ids = set()

    def _run_model_and_transfers(self, scheduled):
        """The model runner and the connector's worker side."""
        num_scheduled, meta = scheduled
        sampled = {}
        for request_id in num_scheduled:
            request = self.requests[request_id]
            if request.num_computed_tokens >= request.num_tokens:
                sampled[request_id] = self.sampler(request)
        worker_output = None
        if self.connector is not None:
            worker_output = self._worker_side(meta)
        return sampled, worker_output

    def _worker_side(self, meta):
        """What ``OffloadingConnectorWorker`` (one worker) reports for this step.

        Stores: ``prepare_store_kv`` defers a step's store jobs to the start of
        the next step, so the earliest step that can report a store is the one
        after the step that issued it. Each store gets a delay drawn from the
        engine's seeded generator (``EngineShape.offload_store_delay``, 1 to 3
        steps); the CPU store handler reports transfers in the order they were
        submitted, so a store whose delay ends before an earlier store's is
        reported with that earlier store. A
        job in ``jobs_to_flush`` (a preempted request's stores, a finished
        request's stores whose GPU blocks were allocated again, every job after
        a connector reset) is submitted and waited for at the start of the step
        that names it (``handle_preemptions``), after the stores deferred from
        earlier steps; it is reported in that step, and so is every store
        submitted before it.

        Loads: submitted at the step's start (``start_kv_transfers``) and
        reported in the same step, async loads also in ``finished_recving``; the
        request runs from the next step on. Store results come first, as the CPU
        worker's ``get_finished`` lists them.
        """
        step = self.counts["steps"]
        flush = set(meta.jobs_to_flush or ())
        for job_id in meta.store_jobs:
            if job_id in flush:
                self.pending_stores.append([job_id, step])
        pending = [job_id for job_id, _ in self.pending_stores]
        unknown = flush - set(pending)
        if unknown:
            raise RuntimeError(f"flushed jobs {sorted(unknown)} are no pending stores")
        last_flushed = max((i for i, job_id in enumerate(pending) if job_id in flush),
                           default=-1)
        for entry in self.pending_stores[:last_flushed + 1]:
            entry[1] = step
        self.counts["flushed_stores"] += len(flush)
        low, high = self.shape.offload_store_delay
        for job_id in meta.store_jobs:
            if job_id not in flush:
                due = step + self.store_delays.randint(low, high)
                if self.pending_stores:
                    due = max(due, self.pending_stores[-1][1])
                self.pending_stores.append([job_id, due])
            self.counts["stores"] += 1

        worker_meta = self.V.OffloadingWorkerMetadata()
        while self.pending_stores and self.pending_stores[0][1] <= step:
            worker_meta.mark_completed(self.pending_stores.pop(0)[0])
        finished_recving = set()
        for job_id, job in meta.load_jobs.items():
            worker_meta.mark_completed(job_id)
            if not job.sync:
                finished_recving.add(job.req_id)
        return self.V.KVConnectorOutput(
            finished_sending=set(),
            finished_recving=finished_recving,
            kv_connector_worker_meta=worker_meta if worker_meta.completed_jobs else None,
        )

    def _update_from_output(self, scheduled, worker_output, ts):
        V = self.V
        num_scheduled, _ = scheduled
        sampled, connector_output = worker_output
        stopped = []
        for request_id, num in num_scheduled.items():
            request = self.requests[request_id]
            request.num_in_flight_tokens -= num
            if request.is_finished():
                continue
            token = sampled.get(request_id)
            if token is None:
                continue
            request.append_output_token_ids(token)
            if V.check_stop(request, MAX_MODEL_LEN):
                stopped.append(request)
        for request in stopped:
            self.running.remove(request)
            self._free_request(request)

        if self.connector is not None:
            self.connector.update_connector_output(connector_output)
            for request_id in connector_output.finished_recving:
                request = self.requests[request_id]
                if request.status == V.RequestStatus.WAITING_FOR_REMOTE_KVS:
                    self.finished_recving.add(request_id)
                else:
                    assert request.is_finished()
                    self._free_blocks(request)

        events = self.kv.take_events()
        if self.connector is not None:
            connector_events = self.connector.take_events()
            if connector_events:
                events.extend(connector_events)
        if events:
            self.publisher.publish(V.KVEventBatch(ts=ts, events=events))
            self.num_published += 1
            return 1
        return 0

    # ----------------------------------------------------------- scheduler helpers

    def _preempt(self, request):
        """``Scheduler._preempt_request`` (no async output in flight)."""
        assert request.status == self.V.RequestStatus.RUNNING
        self.kv.free(request)
        self.inflight_prefills.discard(request.request_id)
        request.status = self.V.RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.waiting.insert(0, request)
        self.preempted_req_ids.add(request.request_id)
        self.counts["preemptions"] += 1

    def _update_waiting_for_remote_kv(self, request):
        """``Scheduler._update_waiting_for_remote_kv`` for a load that succeeded."""
        self.kv.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens == request.num_tokens:
            request.num_computed_tokens = request.num_tokens - 1
        self.finished_recving.remove(request.request_id)

    def _request_remaining_blocks(self, request):
        full = min(request.num_tokens, MAX_MODEL_LEN)
        return self.kv.coordinator.get_num_blocks_to_allocate(
            request_id=request.request_id,
            num_tokens=full,
            new_computed_blocks=self.kv.empty_kv_cache_blocks.blocks,
            num_encoder_tokens=0,
            total_computed_tokens=request.num_computed_tokens,
            num_local_computed_tokens=request.num_computed_tokens,
            num_tokens_main_model=full,
            apply_admission_cap=True,
            prefill_end=max(request.num_prompt_tokens, request.num_tokens - 1),
        )

    def _inflight_prefill_reserved_blocks(self):
        return sum(self._request_remaining_blocks(self.requests[r])
                   for r in sorted(self.inflight_prefills))

    def _free_request(self, request):
        """``Scheduler._free_request`` with ``_connector_finished``."""
        assert request.is_finished()
        self.inflight_prefills.discard(request.request_id)
        delay_free = False
        if self.connector is not None:
            self.kv.finalize_partial_tail_offloads(request)
            self.kv.remove_skipped_blocks(
                request.request_id,
                max(0, request.num_computed_tokens - request.num_in_flight_tokens),
                num_prompt_tokens=request.num_prompt_tokens)
            block_ids = self.kv.get_block_ids_for_computed_tokens(
                request.request_id, request.num_computed_tokens)
            delay_free, _ = self.connector.request_finished_all_groups(request, block_ids)
        self.finished_req_ids.add(request.request_id)
        if not delay_free:
            self._free_blocks(request)
        if self.on_finished is not None:
            self.on_finished(request)

    def _free_blocks(self, request):
        self.kv.free(request)
        del self.requests[request.request_id]

    # ----------------------------------------------------------- out-of-band calls

    def can_reset(self):
        """``reset_prefix_cache`` fails while an async load holds blocks."""
        return not self.kv_holding

    def reset_prefix_cache(self, reset_connector):
        """``Scheduler.reset_prefix_cache(reset_running_requests=True, reset_connector)``."""
        while self.running:
            self._preempt(self.running.pop())
        self.prev_step_scheduled.clear()
        if not self.kv.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset the prefix cache")
        if reset_connector and self.connector is not None:
            self.connector.reset_cache()
        self.counts["resets"] += 1

    def shutdown(self):
        self.publisher.shutdown()
        if self.connector is not None:
            self.connector.shutdown()
