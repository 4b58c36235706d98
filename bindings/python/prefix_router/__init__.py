"""Cache-aware request routing for LLM serving: the Rust crate ``prefix-router`` from Python.

>>> from prefix_router import Router
>>> router = Router(4)                        # workers 0..4, the balanced policy
>>> system = list(range(2_000))
>>> with router.route(system + [7]) as first:
...     pass                                  # forward to first.worker, stream the answer
>>> again = router.route(system + [8])
>>> again.worker == first.worker, again.cached_tokens
(True, 2000)
>>> router.complete(again)
"""

from ._errors import (
    BlockSizeMismatch,
    DecodeError,
    InvalidBlockSize,
    InvalidConfig,
    InvalidEvent,
    InvalidRank,
    InvalidTokens,
    NoWorkers,
    PrefixRouterError,
    ReplicaSyncError,
    Shed,
    UnknownWorker,
    WorkerExists,
    WorkerOutOfRange,
    WrongRole,
)
from ._native import (
    AdmissionConfig,
    BalancedConfig,
    CacheAwareConfig,
    Candidate,
    Decision,
    EngineLoad,
    Explanation,
    FleetSignals,
    Leg,
    LoadConfig,
    PairDecision,
    PairRouter,
    PrefixHasher,
    Router,
    StepModel,
    SyncOutcome,
    WorkerSignals,
    __version__,
    namespace_salt,
)

__all__ = [
    "AdmissionConfig",
    "BalancedConfig",
    "BlockSizeMismatch",
    "CacheAwareConfig",
    "Candidate",
    "Decision",
    "DecodeError",
    "EngineLoad",
    "Explanation",
    "FleetSignals",
    "InvalidBlockSize",
    "InvalidConfig",
    "InvalidEvent",
    "InvalidRank",
    "InvalidTokens",
    "Leg",
    "LoadConfig",
    "NoWorkers",
    "PairDecision",
    "PairRouter",
    "PrefixHasher",
    "PrefixRouterError",
    "ReplicaSyncError",
    "Router",
    "Shed",
    "StepModel",
    "SyncOutcome",
    "UnknownWorker",
    "WorkerExists",
    "WorkerOutOfRange",
    "WorkerSignals",
    "WrongRole",
    "__version__",
    "namespace_salt",
]
