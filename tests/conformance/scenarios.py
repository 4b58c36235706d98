"""The scenarios: families of seeded runs, one output file per run.

A family fixes the fleet (endpoints, data-parallel ranks), the workload and
which engine settings vary; each member is one seed. Member 0 of a family is
its base: the engines configured as the family's name says (the first seven
families' bases are the suite's original scenarios, with their seeds). Every
other member draws each endpoint's settings from the family's space with a
generator seeded by the family's name and the member's seed, so one router
meets engines configured differently: GPU pool sizes, sliding windows,
offloading chunk sizes with placeholder or self-describing CPU events, report
modes, and prefix-cache resets. The ranks of one endpoint share its settings,
as vLLM's data-parallel engines share one configuration.

``members(grid)`` lists the runs: "sample" (what CI runs: each family's first
``sample_members``, 8, or 10 for the three families that mix settings in one
router) or "full" (``FULL_MEMBERS`` members of every family); run.sh's
CONFORMANCE_MEMBERS=N takes N members of every family instead. Pools are small against the workload (a turn's prompt is up to
~900 tokens, five requests are in flight per engine), so blocks are evicted
and requests preempted all the time.
"""

import random
from dataclasses import dataclass, replace

from engine_config import EngineShape
from workload import Namespace, WorkloadShape, lora

PROBE_ONLY = (
    Namespace(cache_salt="probe-only-salt"),
    Namespace(lora=lora("probe-only-adapter", 7)),
)

FULL_MEMBERS = 60
SEED_STRIDE = 1000  # member k of a family runs seed base_seed + k * SEED_STRIDE


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
    family: str
    member: int
    seed: int
    endpoints: int
    ranks: int
    engines: tuple  # one EngineShape per endpoint (its ranks share it)
    workload: WorkloadShape
    ticks: int = 400
    probe_every: int = 10
    probes_per_round: int = 8
    resets: tuple = ()

    @property
    def name(self):
        """The run's name, also its file's: the family and the seed."""
        return f"{self.family}-{self.seed}"

    def engine(self, endpoint):
        return self.engines[endpoint]


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
NAMESPACE_WEIGHTS = (3, 1, 1, 1, 1, 1, 1, 1, 1)

# The spaces engine settings are drawn from. GPU pools: the smallest hold one
# longest request (57 blocks, a 900-token prompt) with little room beside it, so
# requests are preempted; a hybrid model's pool holds every group's blocks, so
# it is drawn per group (a request holds up to 57 blocks of each: a window
# longer than the prompt keeps every block).
GPU_BLOCKS = (64, 72, 96, 128, 192)
GPU_BLOCKS_PER_GROUP = (60, 64, 80, 112)
# Windows in tokens: a block's worth, windows that end inside a block (100,
# 1000), and one longer than any prompt (1000).
WINDOWS = (16, 32, 64, 100, 128, 256, 512, 1000)
CHUNK_BLOCKS = (1, 2, 4)
CPU_BLOCKS = (32, 96, 192, 384)
REPORT_MODES = ("namespace", "all", "none")


def _gpu(rng, windows=()):
    if windows:
        return rng.choice(GPU_BLOCKS_PER_GROUP) * (1 + len(windows))
    return rng.choice(GPU_BLOCKS)


def _hybrid(rng, windows, **kwargs):
    return EngineShape(num_gpu_blocks=_gpu(rng, windows), sliding_windows=windows, **kwargs)


def _offload(rng, shape, self_describing=None):
    sd = rng.random() < 0.5 if self_describing is None else self_describing
    return replace(shape, offload_blocks_per_chunk=rng.choice(CHUNK_BLOCKS),
                   offload_self_describing=sd, offload_cpu_blocks=rng.choice(CPU_BLOCKS))


def _windows(rng):
    """A hybrid model's windows: one, or two of different sizes."""
    if rng.random() < 0.25:
        return tuple(sorted(rng.sample(WINDOWS, 2)))
    return (rng.choice(WINDOWS),)


def _resets(rng, endpoints, ranks, chance):
    """Zero or one reset on a random engine at a random tick, sometimes with the
    connector's CPU copies dropped as well."""
    if rng.random() >= chance:
        return ()
    return (Reset(tick=rng.randrange(60, 340), endpoint=rng.randrange(endpoints),
                  rank=rng.randrange(ranks), reset_connector=rng.random() < 0.5),)


@dataclass(frozen=True)
class Family:
    name: str
    base_seed: int
    endpoints: int
    ranks: int
    base: tuple  # member 0's engines, one per endpoint
    draw: object  # (rng, endpoint) -> EngineShape, for members 1 and up
    workload: WorkloadShape
    probes_per_round: int = 8
    base_resets: tuple = ()
    reset_chance: float = 0.0  # members 1 and up: the chance of a drawn reset
    sample_members: int = 8

    def member(self, k):
        seed = self.base_seed + k * SEED_STRIDE
        if k == 0:
            engines, resets = self.base, self.base_resets
        else:
            rng = random.Random(f"{self.name}/{seed}")
            engines = tuple(self.draw(rng, e) for e in range(self.endpoints))
            resets = _resets(rng, self.endpoints, self.ranks, self.reset_chance)
        return Scenario(family=self.name, member=k, seed=seed, endpoints=self.endpoints,
                        ranks=self.ranks, engines=engines, workload=self.workload,
                        probes_per_round=self.probes_per_round, resets=resets)


def _same(shape, n):
    return (shape,) * n


def _draw_plain(rng, _):
    return EngineShape(num_gpu_blocks=_gpu(rng))


def _draw_namespaces(rng, _):
    return EngineShape(num_gpu_blocks=_gpu(rng), report_mode=rng.choice(REPORT_MODES))


def _draw_offload(self_describing):
    def draw(rng, _):
        return _offload(rng, EngineShape(num_gpu_blocks=_gpu(rng)), self_describing)
    return draw


def _draw_hybrid(window):
    def draw(rng, _):
        return _hybrid(rng, (window,))
    return draw


def _draw_hybrid_mixed(rng, _):
    if rng.random() < 0.25:
        return EngineShape(num_gpu_blocks=_gpu(rng))
    return _hybrid(rng, _windows(rng))


def _draw_offload_mixed(rng, _):
    shape = EngineShape(num_gpu_blocks=_gpu(rng), report_mode=rng.choice(REPORT_MODES))
    return shape if rng.random() < 0.2 else _offload(rng, shape)


def _draw_hybrid_offload(rng, _):
    return _offload(rng, _hybrid(rng, _windows(rng)))


def _draw_mixed(rng, _):
    """Anything: a plain or hybrid model, offloading or not, any report mode."""
    report_mode = rng.choice(REPORT_MODES)
    if rng.random() < 0.4:
        shape = _hybrid(rng, _windows(rng), report_mode=report_mode)
    else:
        shape = EngineShape(num_gpu_blocks=_gpu(rng), report_mode=report_mode)
    return _offload(rng, shape) if rng.random() < 0.5 else shape


OFFLOAD_1_PLACEHOLDER = EngineShape(num_gpu_blocks=96, offload_blocks_per_chunk=1,
                                    offload_self_describing=False, offload_cpu_blocks=192)
OFFLOAD_4_SELF_DESCRIBING = EngineShape(num_gpu_blocks=96, offload_blocks_per_chunk=4,
                                        offload_self_describing=True, offload_cpu_blocks=192)

FAMILIES = (
    Family(
        name="plain", base_seed=11, endpoints=4, ranks=1,
        base=_same(EngineShape(num_gpu_blocks=128), 4), draw=_draw_plain,
        workload=_workload(),
    ),
    Family(
        name="namespaces", base_seed=12, endpoints=3, ranks=1,
        base=_same(EngineShape(num_gpu_blocks=128), 3), draw=_draw_namespaces,
        workload=_workload(namespaces=NAMESPACES, namespace_weights=NAMESPACE_WEIGHTS),
        probes_per_round=10,
    ),
    Family(
        name="offload_placeholder", base_seed=13, endpoints=2, ranks=1,
        base=_same(OFFLOAD_1_PLACEHOLDER, 2), draw=_draw_offload(False),
        workload=_workload(), probes_per_round=16, reset_chance=0.5,
    ),
    Family(
        name="offload_self_describing", base_seed=14, endpoints=2, ranks=1,
        base=_same(OFFLOAD_4_SELF_DESCRIBING, 2), draw=_draw_offload(True),
        workload=_workload(), probes_per_round=16,
        base_resets=(Reset(tick=200, endpoint=1, rank=0, reset_connector=False),),
        reset_chance=0.5,
    ),
    Family(
        name="hybrid_sw128", base_seed=15, endpoints=2, ranks=1,
        base=_same(EngineShape(num_gpu_blocks=160, sliding_windows=(128,)), 2),
        draw=_draw_hybrid(128), workload=_workload(), probes_per_round=16,
    ),
    Family(
        name="hybrid_sw512", base_seed=16, endpoints=2, ranks=1,
        base=_same(EngineShape(num_gpu_blocks=160, sliding_windows=(512,)), 2),
        draw=_draw_hybrid(512), workload=_workload(), probes_per_round=16,
    ),
    Family(
        name="dp", base_seed=17, endpoints=2, ranks=2,
        base=_same(EngineShape(num_gpu_blocks=128), 2), draw=_draw_plain,
        workload=_workload(),
    ),
    # One router, engines configured differently.
    Family(
        name="hybrid_mixed", base_seed=18, endpoints=3, ranks=1,
        base=(EngineShape(num_gpu_blocks=160, sliding_windows=(128,)),
              EngineShape(num_gpu_blocks=160, sliding_windows=(512,)),
              EngineShape(num_gpu_blocks=128)),
        draw=_draw_hybrid_mixed, workload=_workload(), probes_per_round=12,
        reset_chance=0.3, sample_members=10,
    ),
    Family(
        name="hybrid_offload", base_seed=21, endpoints=2, ranks=1,
        base=(replace(OFFLOAD_4_SELF_DESCRIBING, num_gpu_blocks=160, sliding_windows=(128,)),
              replace(OFFLOAD_1_PLACEHOLDER, num_gpu_blocks=160, sliding_windows=(512,))),
        draw=_draw_hybrid_offload, workload=_workload(), probes_per_round=16,
        reset_chance=0.3,
    ),
    Family(
        name="offload_mixed", base_seed=19, endpoints=3, ranks=1,
        base=(OFFLOAD_1_PLACEHOLDER, OFFLOAD_4_SELF_DESCRIBING,
              EngineShape(num_gpu_blocks=96)),
        draw=_draw_offload_mixed,
        workload=_workload(namespaces=NAMESPACES, namespace_weights=NAMESPACE_WEIGHTS),
        probes_per_round=12, reset_chance=0.5, sample_members=10,
    ),
    Family(
        name="mixed", base_seed=20, endpoints=4, ranks=1,
        base=(EngineShape(num_gpu_blocks=160, sliding_windows=(128,), report_mode="all"),
              replace(OFFLOAD_1_PLACEHOLDER, num_gpu_blocks=72),
              replace(OFFLOAD_4_SELF_DESCRIBING, offload_blocks_per_chunk=2),
              EngineShape(num_gpu_blocks=64, report_mode="none")),
        draw=_draw_mixed,
        workload=_workload(namespaces=NAMESPACES, namespace_weights=NAMESPACE_WEIGHTS),
        probes_per_round=10,
        base_resets=(Reset(tick=150, endpoint=2, rank=0, reset_connector=True),),
        reset_chance=0.6, sample_members=10,
    ),
)

BY_FAMILY = {f.name: f for f in FAMILIES}


def members(grid, count=None):
    """The runs of ``grid`` ("sample" or "full"); ``count`` members of every family
    instead when given."""
    out = []
    for family in FAMILIES:
        if count is not None:
            n = count
        elif grid == "full":
            n = FULL_MEMBERS
        elif grid == "sample":
            n = family.sample_members
        else:
            raise SystemExit(f"unknown grid {grid!r}: sample or full")
        out += [family.member(k) for k in range(n)]
    return out
