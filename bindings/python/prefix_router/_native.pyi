"""Type stubs of the native module (the Rust crate `prefix-router` behind PyO3).

Every name here is re-exported by `prefix_router`; import from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Literal, final

from typing_extensions import Buffer, Self

#: Token IDs: a list or tuple of ints, or any buffer of integers (``array('I')``, a NumPy
#: array of uint32/int32/uint64/int64). A uint32 buffer is copied once (memcpy), never
#: converted token by token; other integer buffers are checked and converted in Rust.
_Tokens = Sequence[int] | Buffer

_Policy = Literal[
    "balanced",
    "cache_aware",
    "round_robin",
    "least_loaded",
    "power_of_two",
    "consistent_hash",
    "affinity",
]
_PriorityName = Literal["sheddable", "standard", "critical"]
_LimitName = Literal["queue", "kv", "decode", "prompt", "stale"]
_TierName = Literal["device", "host", "disk", "remote"]
_RoleName = Literal["prefill", "decode", "both"]

__all__: list[str]
__version__: str

# ---------------------------------------------------------------------------- settings

@final
class StepModel:
    """The engine's step model the predictions use (vLLM's scheduler terms)."""

    def __new__(
        cls,
        *,
        max_num_batched_tokens: int = ...,
        max_num_seqs: int = ...,
        step_base_s: float = ...,
        step_s_per_decode: float = ...,
        step_s_per_context_token: float = ...,
    ) -> Self: ...
    max_num_batched_tokens: int
    max_num_seqs: int
    step_base_s: float
    step_s_per_decode: float
    step_s_per_context_token: float

@final
class AdmissionConfig:
    def __new__(
        cls,
        *,
        sheddable_share: float = ...,
        oversized_wait_share: float = ...,
        initial_decode_window: int = ...,
    ) -> Self: ...
    sheddable_share: float
    oversized_wait_share: float
    initial_decode_window: int

@final
class LoadConfig:
    def __new__(
        cls,
        *,
        prefill_tokens_per_s: float = ...,
        default_output_tokens: int = ...,
        learning_rate: float = ...,
        max_report_age_s: float = ...,
        replicas: int = ...,
        step: StepModel | None = None,
        admission: AdmissionConfig | None = None,
        busy_horizon_s: float = ...,
    ) -> Self: ...
    prefill_tokens_per_s: float
    #: The load at which a worker counts as fully busy in the fleet's load.
    busy_horizon_s: float
    default_output_tokens: int
    learning_rate: float
    max_report_age_s: float
    replicas: int
    step: StepModel
    admission: AdmissionConfig

@final
class BalancedConfig:
    def __new__(
        cls,
        *,
        alpha: float = ...,
        scoring: Literal["predicted_ttft", "weighted"] = "predicted_ttft",
        miss_weight: float | None = None,
        miss_weight_max: float = ...,
    ) -> Self:
        """``miss_weight`` fixes the weight of a recomputed token; without it the weight
        follows the fleet's load, from 1 on an idle fleet to ``miss_weight_max`` once every
        worker is busy (``LoadConfig.busy_horizon_s``)."""
    alpha: float
    scoring: str
    #: The fixed weight of a miss; None when it follows the fleet's load.
    miss_weight: float | None
    miss_weight_max: float

@final
class CacheAwareConfig:
    def __new__(
        cls,
        *,
        cache_threshold: float = ...,
        balance_abs_threshold: int = ...,
        balance_rel_threshold: float = ...,
    ) -> Self: ...
    cache_threshold: float
    balance_abs_threshold: int
    balance_rel_threshold: float

# ---------------------------------------------------------------------------- routing

@final
class Decision:
    """Where a request went and what was predicted of it; one charge of load.

    Release it once with ``Router.complete`` (or use it as a context manager, which
    completes on exit); completing twice is a no-op.
    """

    worker: int
    #: The worker's data-parallel rank in its endpoint (0 without ranks).
    rank: int
    #: The endpoint (``worker`` without ranks).
    endpoint: int
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    predicted_ttft_s: float
    predicted_tpot_s: float
    completed: bool
    #: Every candidate the policy weighed, when routed with ``explain=True``; else None.
    explanation: Explanation | None
    def cached_tokens_at(self, tier: _TierName) -> int: ...
    def __enter__(self) -> Decision: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

@final
class Candidate:
    worker: int
    requests: int
    prefill_tokens: int
    cached_tokens: int
    #: The policy's cost terms, name to value (empty for policies that do not cost).
    cost: dict[str, float]
    #: The same terms in the policy's order.
    terms: list[tuple[str, float]]
    total_cost: float | None

@final
class Explanation:
    """Every candidate the policy weighed; ``str()`` gives the crate's one-line receipt."""

    policy: str
    chosen: int
    prompt_tokens: int
    candidates: list[Candidate]
    #: The crate's one-line receipt (also ``str(explanation)``).
    text: str

@final
class EngineLoad:
    """What a worker's engine reported (its metrics endpoint)."""

    def __new__(
        cls,
        *,
        waiting: int,
        running: int,
        measured_at_s: float,
        kv_usage: float | None = None,
        prefill_tokens: int | None = None,
    ) -> Self: ...
    waiting: int
    running: int
    kv_usage: float
    measured_at_s: float
    prefill_tokens: int | None

@final
class WorkerSignals:
    worker: int
    available: bool
    wait_s: float
    kv_usage: float
    requests: int
    routed: int
    prompt_tokens: int
    captured_tokens: int
    available_tokens: int

@final
class FleetSignals:
    at_s: float
    workers: list[WorkerSignals]
    #: Refusals by limit name.
    shed_by_limit: dict[str, int]
    #: Refusals by priority name.
    shed_by_priority: dict[str, int]
    #: Refusals by the gate that refused them: model, prompt, prefill_window, decode_bound.
    shed_by_gate: dict[str, int]
    routed: int
    prompt_tokens: int
    captured_tokens: int
    uncached_tokens: int
    predicted_hit_ratio: float
    shed: int

@final
class SyncOutcome:
    """What applying events did, summed over a batch's events."""

    #: The batch's sequence number against the worker's previous one.
    sequence: Literal["in_order", "gap", "restart"]
    #: For a gap, the seq that should have come next; else None.
    expected_seq: int | None
    stored_blocks: int
    removed_blocks: int
    duplicate_blocks: int
    unknown_parent_blocks: int
    unknown_removed_blocks: int
    unknown_blocks: int
    settings_conflicts: int
    skipped_blocks: int

@final
class Router:
    """A routing policy with load tracking and (for ``balanced`` and ``cache_aware``) a
    mirror of every worker's prefix cache. Safe to share between threads: ``route`` and
    event application release the GIL."""

    def __new__(
        cls,
        workers: int,
        policy: _Policy = "balanced",
        *,
        block_size: int = 16,
        hash: Literal["xxh3", "sha256"] = "xxh3",
        seed: int | None = None,
        ranks: int = 1,
        balanced: BalancedConfig | None = None,
        cache_aware: CacheAwareConfig | None = None,
        load: LoadConfig | None = None,
        worker_capacity_blocks: int | None = None,
        max_blocks: int | None = None,
        ttl_routes: int | None = None,
        host_chunk_blocks: int = 1,
        full_reports: bool = False,
        ttl: int | None = None,
    ) -> Self: ...
    def target(self, endpoint: int, rank: int = 0) -> int:
        """The routing target (``worker`` everywhere else) of an endpoint's rank."""
    @property
    def policy(self) -> str: ...
    @property
    def block_size(self) -> int: ...
    @property
    def ranks(self) -> int: ...
    def route(
        self,
        tokens: _Tokens,
        *,
        salt: bytes | None = None,
        lora: str | None = None,
        cache_salt: str | None = None,
        session: str | None = None,
        ttft_target_s: float | None = None,
        tpot_target_s: float | None = None,
        priority: _PriorityName | None = None,
        expected_output: int | None = None,
        now_s: float | None = None,
        ttft_target: float | None = None,
        tpot_target: float | None = None,
        now: float | None = None,
        explain: bool = False,
    ) -> Decision: ...
    def first_token(
        self, decision: Decision, elapsed_s: float | None = None, *, elapsed: float | None = None
    ) -> None: ...
    def tokens_after(
        self,
        decision: Decision,
        tokens: int,
        elapsed_s: float | None = None,
        *,
        elapsed: float | None = None,
    ) -> None: ...
    def complete(self, decision: Decision) -> None: ...
    def report_load(self, worker: int, load: EngineLoad) -> None: ...
    def add_worker(self, worker: int) -> None: ...
    def remove_worker(self, worker: int) -> None: ...
    def set_available(self, worker: int, available: bool) -> None: ...
    def drain(self, worker: int) -> None: ...
    def workers(self) -> list[int]: ...
    def set_profile(self, worker: int, *, speed: float = 1.0, kv_capacity_tokens: int | None = None) -> None: ...
    def set_engine_settings(
        self,
        worker: int,
        *,
        full_reports: bool | None = None,
        host_chunk_blocks: int | None = None,
        groups: Sequence[tuple[int, str | None, int | None]] | None = None,
    ) -> None: ...
    def fleet_signals(self) -> FleetSignals: ...
    def apply_vllm_events(self, endpoint: int, payload: bytes, seq: int | None = None) -> SyncOutcome: ...
    def replace_worker_cache(self, worker: int, prefixes: Sequence[_Tokens]) -> None: ...
    def report_cached(
        self, worker: int, tokens: _Tokens, cached_tokens: int, *,
        salt: bytes | None = None, lora: str | None = None, cache_salt: str | None = None,
    ) -> None: ...
    def reusable_tokens(
        self, worker: int, tokens: _Tokens, *,
        salt: bytes | None = None, lora: str | None = None, cache_salt: str | None = None,
    ) -> int:
        """_Tokens of ``tokens`` the mirror predicts ``worker`` would reuse (vLLM's hit)."""
    def memory_bytes(self) -> int: ...

# ---------------------------------------------------------------------------- pairs

@final
class Leg:
    """One side of a pair: where it runs and what was predicted of it."""

    worker: int
    rank: int
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    predicted_ttft_s: float
    predicted_tpot_s: float

@final
class PairDecision:
    """A request routed to a pair (prefill apart) or aggregated; one charge of load on
    both sides, released by ``PairRouter.complete`` or on leaving a ``with`` block."""

    decode: Leg
    prefill: Leg | None
    is_split: bool
    def __enter__(self) -> PairDecision: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None: ...

@final
class PairRouter:
    """Routes requests on a prefill/decode fleet to a pair (or aggregated)."""

    def __new__(
        cls,
        roles: Sequence[_RoleName],
        *,
        block_size: int = 16,
        kv_bytes_per_token: int = 131_072,
        bandwidth_bytes_per_s: float | None = None,
        decider: Literal["cost", "always", "never"] = "cost",
        balanced: BalancedConfig | None = None,
        load: LoadConfig | None = None,
    ) -> Self: ...
    def route(
        self,
        tokens: _Tokens,
        *,
        salt: bytes | None = None,
        lora: str | None = None,
        cache_salt: str | None = None,
        session: str | None = None,
        ttft_target_s: float | None = None,
        tpot_target_s: float | None = None,
        priority: _PriorityName | None = None,
        expected_output: int | None = None,
        now_s: float | None = None,
        ttft_target: float | None = None,
        tpot_target: float | None = None,
        now: float | None = None,
    ) -> PairDecision: ...
    def prefill_done(self, pair: PairDecision) -> None: ...
    def first_token(
        self, pair: PairDecision, elapsed_s: float | None = None, *, elapsed: float | None = None
    ) -> None: ...
    def tokens_after(
        self,
        pair: PairDecision,
        tokens: int,
        elapsed_s: float | None = None,
        *,
        elapsed: float | None = None,
    ) -> None: ...
    def complete(self, pair: PairDecision) -> None: ...
    def role(self, worker: int) -> _RoleName: ...
    def fleet_signals(self) -> FleetSignals: ...
    def apply_vllm_events(self, worker: int, payload: bytes, seq: int | None = None) -> SyncOutcome: ...

# ---------------------------------------------------------------------------- hashing

@final
class PrefixHasher:
    def __new__(cls, block_size: int = 16, *, hash: Literal["xxh3", "sha256"] = "xxh3", seed: int | None = None) -> Self: ...
    @property
    def block_size(self) -> int: ...
    def hash(self, tokens: _Tokens, *, salt: bytes | None = None) -> list[int]: ...

def namespace_salt(lora: str | None = None, cache_salt: str | None = None) -> bytes: ...
