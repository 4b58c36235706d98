"""The scenarios: one output file each, every one seeded.

Pools are small against the workload (a turn's prompt is up to ~900 tokens,
five requests are in flight per engine) so blocks are evicted all the time.
"""

from dataclasses import dataclass

from engine_config import EngineShape
from workload import Namespace, WorkloadShape, lora

PROBE_ONLY = (
    Namespace(cache_salt="probe-only-salt"),
    Namespace(lora=lora("probe-only-adapter", 7)),
)


@dataclass(frozen=True)
class Reset:
    """``reset_prefix_cache(reset_running_requests=True, reset_connector=...)`` on one
    engine, at the first tick from ``tick`` on at which vLLM would accept it."""

    tick: int
    endpoint: int
    rank: int
    reset_connector: bool


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    endpoints: int
    ranks: int
    engine: EngineShape
    workload: WorkloadShape
    ticks: int = 400
    probe_every: int = 10
    probes_per_round: int = 8
    reset: Reset | None = None


def _workload(**kwargs):
    kwargs.setdefault("probe_only_namespaces", PROBE_ONLY)
    return WorkloadShape(**kwargs)


NAMESPACES = (
    Namespace(),
    Namespace(cache_salt="tenant-a"),
    Namespace(cache_salt="tenant-b"),
    Namespace(lora=lora("finance", 1)),
    Namespace(lora=lora("legal", 2)),
    Namespace(lora=lora("finance", 1), cache_salt="tenant-a"),
    Namespace(report_full=True),
    Namespace(lora=lora("legal", 2), report_full=True),
    Namespace(cache_salt="tenant-b", report_full=True),
)

SCENARIOS = (
    Scenario(
        name="plain", seed=11, endpoints=4, ranks=1,
        engine=EngineShape(num_gpu_blocks=128),
        workload=_workload(),
    ),
    Scenario(
        name="namespaces", seed=12, endpoints=3, ranks=1,
        engine=EngineShape(num_gpu_blocks=128),
        workload=_workload(namespaces=NAMESPACES,
                           namespace_weights=(3, 1, 1, 1, 1, 1, 1, 1, 1)),
        probes_per_round=10,
    ),
    Scenario(
        name="offload_placeholder", seed=13, endpoints=2, ranks=1,
        engine=EngineShape(num_gpu_blocks=96, offload_blocks_per_chunk=1,
                           offload_self_describing=False, offload_cpu_blocks=192),
        workload=_workload(),
        probes_per_round=16,
    ),
    Scenario(
        name="offload_self_describing", seed=14, endpoints=2, ranks=1,
        engine=EngineShape(num_gpu_blocks=96, offload_blocks_per_chunk=4,
                           offload_self_describing=True, offload_cpu_blocks=192),
        workload=_workload(),
        probes_per_round=16,
        reset=Reset(tick=200, endpoint=1, rank=0, reset_connector=False),
    ),
    Scenario(
        name="hybrid_sw128", seed=15, endpoints=2, ranks=1,
        engine=EngineShape(num_gpu_blocks=160, sliding_window=128),
        workload=_workload(),
        probes_per_round=16,
    ),
    Scenario(
        name="hybrid_sw512", seed=16, endpoints=2, ranks=1,
        engine=EngineShape(num_gpu_blocks=160, sliding_window=512),
        workload=_workload(),
        probes_per_round=16,
    ),
    Scenario(
        name="dp", seed=17, endpoints=2, ranks=2,
        engine=EngineShape(num_gpu_blocks=128),
        workload=_workload(),
    ),
)

BY_NAME = {s.name: s for s in SCENARIOS}
