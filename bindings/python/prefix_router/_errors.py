"""The exceptions the package raises: one class per kind of error, all under
:class:`PrefixRouterError`. Each also derives from the built-in exception a Python caller
would catch for it (``ValueError`` for bad input, ``LookupError`` for an unknown worker), and
carries the error's figures as attributes."""

from __future__ import annotations


class PrefixRouterError(Exception):
    """Base of every error the package raises."""


class InvalidConfig(PrefixRouterError, ValueError):
    """A setting out of its range: ``field``, ``value`` and ``allowed`` say which."""

    field: str
    value: str
    allowed: str


class InvalidBlockSize(PrefixRouterError, ValueError):
    """A block size outside ``1..=max`` tokens."""

    block_size: int
    max: int


class WorkerOutOfRange(PrefixRouterError, ValueError):
    """A worker id at or above ``limit``."""

    worker: int
    limit: int


class UnknownWorker(PrefixRouterError, LookupError):
    """A worker that is not registered."""

    worker: int

    def __str__(self) -> str:  # LookupError's repr-quoting of the message is not wanted
        return str(self.args[0]) if self.args else ""


class WorkerExists(PrefixRouterError, ValueError):
    """A worker added twice."""

    worker: int


class BlockSizeMismatch(PrefixRouterError, ValueError):
    """The engine's events carry another block size than the router hashes with."""

    engine: int
    router: int


class InvalidEvent(PrefixRouterError, ValueError):
    """A cache event that cannot be applied."""


class DecodeError(PrefixRouterError, ValueError):
    """A payload (vLLM's msgpack batch, a replica sync frame) that does not decode."""


class InvalidRank(PrefixRouterError, ValueError):
    """A data-parallel rank beyond the endpoint's ranks."""

    rank: int
    ranks: int


class WrongRole(PrefixRouterError, ValueError):
    """A prefill/decode worker asked to do what its role does not."""

    worker: int
    role: str
    wanted: str


class InvalidTokens(PrefixRouterError, ValueError):
    """Token IDs outside ``0..=2**32 - 1``, or an array that is not one-dimensional."""


class ReplicaSyncError(PrefixRouterError, ValueError):
    """A replica sync frame of another layout version, or a bound passed."""


class NoWorkers(PrefixRouterError, RuntimeError):
    """No worker is registered and available."""


class Shed(PrefixRouterError):
    """Admission refused the request: no worker is predicted to meet its targets.

    ``limit`` names what bound the best worker's prediction (``queue``, ``kv``, ``decode``,
    ``prompt`` or ``stale``); ``gate`` the check that refused it (``model``, ``prompt``,
    ``prefill_window`` or ``decode_bound``), with the value it measured and its threshold
    (``measured_s``, ``threshold_s``); ``retry_after_s`` is the seconds until that worker is
    predicted to meet the target if nothing more arrives, or ``None`` where waiting cannot
    help (``retry_after``: the same, under its former name).
    """

    priority: str
    limit: str
    target_s: float | None
    tpot_target_s: float | None
    best_ttft_s: float
    best_tpot_s: float
    best_worker: int
    gate: str
    measured_s: float
    threshold_s: float
    retry_after_s: float | None
    retry_after: float | None


__all__ = [
    "BlockSizeMismatch",
    "DecodeError",
    "InvalidBlockSize",
    "InvalidConfig",
    "InvalidEvent",
    "InvalidRank",
    "InvalidTokens",
    "NoWorkers",
    "PrefixRouterError",
    "ReplicaSyncError",
    "Shed",
    "UnknownWorker",
    "WorkerExists",
    "WorkerOutOfRange",
    "WrongRole",
]

# Shown as the package's own (``prefix_router.Shed``), where users import them from.
for _name in __all__:
    globals()[_name].__module__ = "prefix_router"
del _name
