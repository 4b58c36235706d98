"""One modelled vLLM engine's configuration, built the way vLLM's engine core builds it.

A real ``VllmConfig`` needs a Hugging Face model config, so each engine gets a
stand-in namespace that carries only the fields the KV cache planning functions
and the offloading connector read. Its sub-configs are vLLM's own classes where
they build without a model (``CacheConfig``, ``KVTransferConfig``,
``KVEventsConfig``, all with vLLM's defaults except the values set here); the
model, parallel, scheduler and attention parts are plain namespaces. A field
that vLLM reads and the stand-in lacks raises AttributeError, never a guess.

The KV cache layout comes from vLLM's own planning code: per-layer specs ->
``get_kv_cache_groups`` -> ``get_kv_cache_config_from_groups`` ->
``generate_scheduler_kv_cache_config`` -> ``resolve_kv_cache_block_sizes`` and
``resolve_cache_hit_alignment_tokens``, exactly as ``EngineCore`` does, with
``num_gpu_blocks_override`` fixing the pool size.
"""

from dataclasses import dataclass
from types import SimpleNamespace

BLOCK_SIZE = 16
MAX_MODEL_LEN = 4096
NUM_KV_HEADS = 2
HEAD_SIZE = 64
# Bytes of one token's K and V for one layer in fp16. Given as the spec's
# state_content_bytes so page sizes are plain integers (vLLM would otherwise ask
# torch for the dtype's size).
STATE_CONTENT_BYTES = 2 * HEAD_SIZE * 2


@dataclass(frozen=True)
class EngineShape:
    """How one engine is configured (a scenario gives each engine its own)."""

    num_gpu_blocks: int
    # Sliding windows in tokens, one attention layer each beside the full-attention
    # layer; () is a model of full attention only.
    sliding_windows: tuple = ()
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 8
    offload_blocks_per_chunk: int | None = None  # None: no offloading connector
    offload_self_describing: bool = False
    offload_cpu_blocks: int = 0  # CPU capacity, in GPU blocks
    # Engine steps from the step that issues a CPU store to the step whose
    # connector output reports it (inclusive range, drawn per store).
    offload_store_delay: tuple = (1, 3)
    # Which requests set kv_cache_report_mode="full": "namespace" (those of namespaces
    # flagged report_full), "all" or "none".
    report_mode: str = "namespace"

    def describe(self):
        """A short label: ``fa``, ``sw128``, ``sw128+512``, then ``/cpu4sd`` (chunk
        blocks, ``sd`` when self-describing, ``ph`` for placeholders), ``/g96`` (GPU
        blocks), and ``/full`` or ``/nofull`` when the report mode is not "namespace"."""
        model = "sw" + "+".join(map(str, self.sliding_windows)) if self.sliding_windows else "fa"
        parts = [model, f"g{self.num_gpu_blocks}"]
        if self.offload_blocks_per_chunk is not None:
            kind = "sd" if self.offload_self_describing else "ph"
            parts.append(f"cpu{self.offload_blocks_per_chunk}{kind}x{self.offload_cpu_blocks}")
        if self.report_mode != "namespace":
            parts.append({"all": "full", "none": "nofull"}[self.report_mode])
        return "/".join(parts)

    def reports_full(self, namespace):
        """Whether a request of ``namespace`` on this engine sets
        kv_cache_report_mode="full"."""
        if self.report_mode == "namespace":
            return namespace.report_full
        return self.report_mode == "all"


def _layer_specs(V, shape):
    kwargs = dict(block_size=BLOCK_SIZE, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE,
                  dtype=V.torch.float16, state_content_bytes=STATE_CONTENT_BYTES)
    specs = {
        "model.layers.0.self_attn": V.FullAttentionSpec(**kwargs),
        "model.layers.1.self_attn": V.FullAttentionSpec(**kwargs),
    }
    if shape.sliding_windows:
        # A hybrid model: one full-attention layer, then one layer per sliding window.
        del specs["model.layers.1.self_attn"]
        for i, window in enumerate(shape.sliding_windows):
            specs[f"model.layers.{i + 1}.self_attn"] = V.SlidingWindowSpec(
                sliding_window=window, **kwargs)
    return specs


def make_vllm_config(V, shape, dp_rank, engine_id, event_endpoint):
    cache = V.CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True,
                          num_gpu_blocks_override=shape.num_gpu_blocks)
    # The engine core resolves the layout before planning; the offloading
    # connector requires this one.
    cache.kv_cache_layout = "LBHNC"
    kv_transfer = None
    if shape.offload_blocks_per_chunk is not None:
        kv_transfer = V.KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            engine_id=engine_id,
            kv_connector_extra_config={
                "blocks_per_chunk": shape.offload_blocks_per_chunk,
                "self_describing_kv_events": shape.offload_self_describing,
                # Filled in by make_engine_setup once the page size is known.
                "cpu_bytes_to_use": 0,
            },
        )
    parallel = SimpleNamespace(
        world_size=1, rank=0, tensor_parallel_size=1, pipeline_parallel_size=1,
        prefill_context_parallel_size=1, decode_context_parallel_size=1,
        data_parallel_index=dp_rank, data_parallel_rank=dp_rank, data_parallel_size=1,
        data_parallel_rank_local=dp_rank, distributed_executor_backend="mp",
        nnodes_within_dp=1)
    model = SimpleNamespace(
        model="conformance-harness", dtype="float16", max_model_len=MAX_MODEL_LEN,
        use_mla=False, get_total_num_kv_heads=lambda: NUM_KV_HEADS)
    scheduler = SimpleNamespace(
        max_num_batched_tokens=shape.max_num_batched_tokens,
        max_num_seqs=shape.max_num_seqs, disable_hybrid_kv_cache_manager=False,
        enable_chunked_prefill=True, long_prefill_token_threshold=0,
        scheduler_reserve_full_isl=True, watermark=0.0)
    return SimpleNamespace(
        cache_config=cache,
        parallel_config=parallel,
        model_config=model,
        scheduler_config=scheduler,
        attention_config=SimpleNamespace(hisparse_config=None),
        kv_transfer_config=kv_transfer,
        kv_events_config=V.KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=event_endpoint),
        speculative_config=None,
        use_v2_model_runner=False,
        num_hash_lookahead_tokens=0,
        # One batch in flight at a time (no async scheduling, no pipeline parallelism).
        max_in_flight_tokens=shape.max_num_batched_tokens,
    )


def plan_kv_cache(V, vllm_config, shape):
    """Returns (scheduler KVCacheConfig, scheduler_block_size, hash_block_size)."""
    P = V.planning
    U = V.kv_cache_utils
    groups = P.get_kv_cache_groups(vllm_config, _layer_specs(V, shape))
    # The memory figure only matters through num_gpu_blocks_override.
    worker_config = P.get_kv_cache_config_from_groups(vllm_config, groups, 1 << 40)
    config = U.generate_scheduler_kv_cache_config([worker_config])
    assert config.num_blocks == shape.num_gpu_blocks, config.num_blocks
    scheduler_block_size, hash_block_size = U.resolve_kv_cache_block_sizes(config, vllm_config)
    config.hash_block_size = hash_block_size
    config.cache_hit_alignment_tokens = U.resolve_cache_hit_alignment_tokens(
        config, vllm_config, scheduler_block_size, hash_block_size)
    return config, scheduler_block_size, hash_block_size


def set_cpu_capacity(vllm_config, kv_cache_config, shape):
    """Sizes the CPU tier to ``shape.offload_cpu_blocks`` GPU blocks' worth of bytes,
    the way a user picks ``cpu_bytes_to_use``."""
    bytes_per_block = kv_cache_config.kv_cache_tensors[0].size // kv_cache_config.num_blocks
    extra = vllm_config.kv_transfer_config.kv_connector_extra_config
    extra["cpu_bytes_to_use"] = shape.offload_cpu_blocks * bytes_per_block


def group_descriptions(V, kv_cache_config):
    """The header's ``groups``: each KV cache group's kind, as vLLM names it in events."""
    out = []
    for group in kv_cache_config.kv_cache_groups:
        entry = {"kind": V.get_kv_cache_spec_kind(group.kv_cache_spec).value}
        window = V.get_kv_cache_spec_sliding_window(group.kv_cache_spec)
        if window is not None:
            entry["window"] = window
        out.append(entry)
    return out
