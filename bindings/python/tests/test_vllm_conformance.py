"""The mirror fed from Python against vLLM's own code, as ``tests/vllm_conformance.rs`` does.

``tests/conformance/run.sh`` drives vLLM's real block pool, KV cache manager, offloading
connector and event publisher through seeded workloads and writes one JSONL file per run:
a header (the engines' settings), every event batch vLLM published (base64 msgpack), the
prefix-cache resets, vLLM's own hit for probe prompts, and an end line with the counts
(``tests/conformance/README.md`` describes the format). This test replays every file of
the directory named by ``PREFIX_ROUTER_CONFORMANCE_OUT`` through the binding, in order:
one ``Router`` per run, each routing target given ``set_engine_settings`` as its engine
was configured, every batch through ``apply_vllm_events`` (decoded in Rust), a reset that
dropped an offloading engine's connector told with ``replace_worker_cache(target, [])``,
and at each probe ``reusable_tokens`` must equal vLLM's ``hit_tokens``, token for token.

A second router per run is told only what events cannot show (the report mode, and the
chunk size of placeholder CPU stores) and must answer every probe as the configured one
does. An unset or empty output directory fails: nothing here passes by skipping.
"""

from __future__ import annotations

import base64
import json
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import pytest

from prefix_router import Router, namespace_salt

if TYPE_CHECKING:
    from prefix_router import SyncOutcome

#: The environment variable naming the harness's output directory.
ENV = "PREFIX_ROUTER_CONFORMANCE_OUT"
#: Every family the harness's sample (and its whole grid) holds (``scenarios.py``).
FAMILIES = [
    "dp",
    "hybrid_mixed",
    "hybrid_offload",
    "hybrid_sw128",
    "hybrid_sw512",
    "mixed",
    "namespaces",
    "offload_mixed",
    "offload_placeholder",
    "offload_self_describing",
    "plain",
]
#: Probes every run must hold at least (41 rounds of 8 to 16 prompts on every engine).
MIN_PROBES = 500
#: The mirror's default chunk size, which no engine of the grid uses (as in the Rust test):
#: a worker whose chunk the mirror neither was told nor learned would be read wrongly.
DEFAULT_CHUNK = 3
#: Misses shown per run, and batches kept per endpoint to show with one.
SHOWN_MISSES = 5
KEPT_BATCHES = 6
#: ``SyncOutcome`` counters that must stay 0 for every batch of every run (the Rust test's
#: "every event vLLM published was applied").
UNAPPLIED = ("unknown_parent_blocks", "unknown_removed_blocks", "unknown_blocks", "skipped_blocks")


def _output_dir() -> Optional[Path]:
    """The harness's output directory, if the environment names one."""
    raw = os.environ.get(ENV)
    return Path(raw) if raw else None


def _files() -> list[Path]:
    """Every run's file in the output directory, sorted (empty without one)."""
    out = _output_dir()
    if out is None or not out.is_dir():
        return []
    return sorted(out.glob("*.jsonl"))


def _no_files_message() -> str:
    """Why there is nothing to replay, and how to make it."""
    out = _output_dir()
    if out is None:
        why = f"{ENV} is not set"
    elif not out.is_dir():
        why = f"{ENV}={out} is not a directory"
    else:
        why = f"{ENV}={out} holds no *.jsonl file"
    return (
        f"{why}: set it to the directory `bash tests/conformance/run.sh` prints on its last "
        "line (target/conformance/vllm-0.33.0/out); this test never skips"
    )


@dataclass(frozen=True)
class Engine:
    """One engine (an endpoint's data-parallel rank) as the header describes it."""

    endpoint: int
    rank: int
    label: str
    #: Each group beyond the main one: ``(index, kind)`` or ``(index, kind, window)``.
    groups: tuple[tuple[Any, ...], ...]
    #: Blocks per CPU chunk and whether CPU stores are self-describing, if it offloads.
    offload: Optional[tuple[int, bool]]
    full_reports: bool

    @staticmethod
    def parse(e: dict[str, Any]) -> Engine:
        """Reads one header engine (group 0 is full attention and is skipped)."""
        groups = []
        for g, spec in enumerate(e["groups"]):
            if g == 0:
                continue
            kind = spec.get("kind") or "full_attention"
            window = spec.get("window")
            groups.append((g, kind) if window is None else (g, kind, int(window)))
        off = e["offload"]
        offload = None if off is None else (int(off["chunk_blocks"]), bool(off["self_describing"]))
        return Engine(
            endpoint=int(e["endpoint"]),
            rank=int(e["rank"]),
            label=str(e["label"]),
            groups=tuple(groups),
            offload=offload,
            full_reports=bool(e["full_reports"]),
        )

    def settings(self) -> dict[str, Any]:
        """``set_engine_settings`` keywords for everything the engine was configured with."""
        s: dict[str, Any] = {"full_reports": self.full_reports, "groups": list(self.groups)}
        if self.offload is not None:
            s["host_chunk_blocks"] = self.offload[0]
        return s

    def unlearnable_settings(self) -> dict[str, Any]:
        """Only what events cannot show: the report mode, a placeholder engine's chunk."""
        s: dict[str, Any] = {"full_reports": self.full_reports}
        if self.offload is not None and not self.offload[1]:
            s["host_chunk_blocks"] = self.offload[0]
        return s


@dataclass
class Header:
    """A run's header: how to build the routers that replay it."""

    scenario: str
    family: str
    seed: int
    block_size: int
    endpoints: int
    ranks: int
    engines: list[Engine]

    @staticmethod
    def parse(line: dict[str, Any]) -> Header:
        """Reads the first line of a run's file."""
        assert line.get("kind") == "header", f"the first line is a header: {str(line)[:200]}"
        return Header(
            scenario=str(line["scenario"]),
            family=str(line["family"]),
            seed=int(line["seed"]),
            block_size=int(line["block_size"]),
            endpoints=int(line["endpoints"]),
            ranks=int(line["ranks"]),
            engines=[Engine.parse(e) for e in line["engines"]],
        )

    def engine(self, endpoint: int, rank: int) -> Engine:
        """The engine at ``endpoint``/``rank``."""
        for e in self.engines:
            if (e.endpoint, e.rank) == (endpoint, rank):
                return e
        raise AssertionError(f"{self.scenario}: the header describes no engine {endpoint}/{rank}")


@dataclass
class Replay:
    """What replaying one run found."""

    header: Header
    configured: Router
    learned: Router
    batches: int = 0
    probes: int = 0
    pending: int = 0
    resets: int = 0
    hit_tokens: int = 0
    end: Optional[dict[str, Any]] = None
    #: Sums of the ``UNAPPLIED`` counters and ``settings_conflicts`` per router.
    unapplied: dict[str, int] = field(default_factory=dict)
    learned_unapplied: dict[str, int] = field(default_factory=dict)
    misses: list[str] = field(default_factory=list)
    learned_misses: list[str] = field(default_factory=list)
    #: The last batches applied per endpoint: ``(seq, stored, removed)``.
    trail: dict[int, deque[tuple[int, int, int]]] = field(default_factory=dict)


def _new_replay(header: Header) -> Replay:
    """Both routers of a run, each engine's target told its settings."""
    routers = []
    for _ in range(2):
        routers.append(
            Router(
                header.endpoints,
                "balanced",
                block_size=header.block_size,
                ranks=header.ranks,
                host_chunk_blocks=DEFAULT_CHUNK,
            )
        )
    configured, learned = routers
    for e in header.engines:
        target = configured.target(e.endpoint, e.rank)
        assert target == e.endpoint * header.ranks + e.rank, (
            f"Router.target({e.endpoint}, {e.rank}) = {target} with ranks={header.ranks}; "
            f"expected endpoint * ranks + rank = {e.endpoint * header.ranks + e.rank}"
        )
        configured.set_engine_settings(target, **e.settings())
        learned.set_engine_settings(target, **e.unlearnable_settings())
    counters = {name: 0 for name in (*UNAPPLIED, "settings_conflicts")}
    return Replay(
        header=header,
        configured=configured,
        learned=learned,
        unapplied=dict(counters),
        learned_unapplied=dict(counters),
    )


def _add(totals: dict[str, int], outcome: SyncOutcome) -> None:
    """Adds a batch's outcome to ``totals``."""
    for name in totals:
        totals[name] += getattr(outcome, name)


def _batch(r: Replay, line: dict[str, Any]) -> None:
    """Applies one published batch to both routers (decoded in Rust)."""
    endpoint = int(line["endpoint"])
    seq = int(line["seq"])
    payload = base64.b64decode(line["payload"])
    outcome = r.configured.apply_vllm_events(endpoint, payload, seq)
    _add(r.unapplied, outcome)
    _add(r.learned_unapplied, r.learned.apply_vllm_events(endpoint, payload, seq))
    kept = r.trail.setdefault(endpoint, deque(maxlen=KEPT_BATCHES))
    kept.append((seq, outcome.stored_blocks, outcome.removed_blocks))
    r.batches += 1


def _reset(r: Replay, line: dict[str, Any]) -> None:
    """A prefix-cache reset: one that dropped an offloading engine's connector publishes no
    CPU removal, so the host tells the mirror (``replace_worker_cache`` with nothing)."""
    endpoint, rank = int(line["endpoint"]), int(line.get("rank") or 0)
    engine = r.header.engine(endpoint, rank)
    r.resets += 1
    if line.get("reset_connector") is True and engine.offload is not None:
        target = r.configured.target(endpoint, rank)
        r.configured.replace_worker_cache(target, [])
        r.learned.replace_worker_cache(target, [])


def _probe(r: Replay, line: dict[str, Any]) -> None:
    """Checks one probe: the configured router's reusable tokens against vLLM's hit, and the
    learning router's against the configured one's."""
    tokens: list[int] = line["tokens"]
    endpoint, rank = int(line["endpoint"]), int(line.get("rank") or 0)
    lora: Optional[str] = line.get("lora_name")
    cache_salt: Optional[str] = line.get("cache_salt")
    target = r.configured.target(endpoint, rank)
    mirror = r.configured.reusable_tokens(target, tokens, lora=lora, cache_salt=cache_salt)
    learned = r.learned.reusable_tokens(target, tokens, lora=lora, cache_salt=cache_salt)
    # The Rust test hashes the namespace as `namespace_salt(lora, cache_salt)`: the explicit
    # salt must name the same blocks as the keywords.
    salted = mirror
    if lora is not None or cache_salt is not None:
        salted = r.configured.reusable_tokens(target, tokens, salt=namespace_salt(lora, cache_salt))
    vllm_hit = int(line["hit_tokens"])
    pending = line.get("external_pending") is True
    probe_id = line.get("id", "?")
    r.probes += 1
    r.pending += int(pending)
    r.hit_tokens += vllm_hit
    if learned != mirror:
        r.learned_misses.append(
            f"probe {probe_id} on {endpoint}/{rank}: configured {mirror}, learned {learned}"
        )
    if mirror == vllm_hit and salted == vllm_hit:
        return
    h = r.header
    engine = h.engine(endpoint, rank)
    trail = ", ".join(f"seq {s} (+{st}/-{rm})" for s, st, rm in r.trail.get(endpoint, ())) or "none"
    ranks_note = " (any rank)" if h.ranks > 1 else ""
    salt_note = "" if salted == mirror else (
        f"; reusable_tokens(salt=namespace_salt({lora!r}, {cache_salt!r})) answers {salted}"
    )
    r.misses.append(
        f"{h.scenario} (seed {h.seed}) probe {probe_id} ({line.get('probe_kind', '?')}, "
        f"{len(tokens)} tokens, lora {lora!r}, salt {cache_salt!r}) on engine {endpoint}/{rank} "
        f"(target {target}) [{engine.label}; set_engine_settings({engine.settings()})]: "
        f"vLLM hit {vllm_hit} (device {line.get('device_hit_tokens')}, external "
        f"{line.get('external_hit_tokens')}{', a CPU store in flight' if pending else ''}), "
        f"reusable_tokens(lora=, cache_salt=) {mirror}{salt_note}\n"
        f"    last batches of endpoint {endpoint}{ranks_note} (blocks stored/removed): {trail}"
    )


def replay(path: Path) -> Replay:
    """Replays one run's file, checking every probe on the way."""
    with path.open("rb") as f:
        header = Header.parse(json.loads(f.readline()))
        r = _new_replay(header)
        for raw in f:
            line = json.loads(raw)
            kind = line.get("kind")
            if r.end is not None:
                raise AssertionError(f"{path.name}: a {kind!r} line after the end line")
            if kind == "batch":
                _batch(r, line)
            elif kind == "probe":
                _probe(r, line)
            elif kind == "reset":
                _reset(r, line)
            elif kind == "end":
                r.end = line
            else:
                raise AssertionError(f"{path.name}: an unknown line: {raw[:200]!r}")
    return r


def _problems(path: Path, r: Replay) -> list[str]:
    """Everything wrong with one run's replay (empty when it conforms)."""
    name = f"{r.header.scenario} ({path.name})"
    problems: list[str] = []
    if r.end is None:
        problems.append(f"{name}: no end line")
    elif (r.end.get("batches"), r.end.get("probes")) != (r.batches, r.probes):
        problems.append(
            f"{name}: the end line counts {r.end.get('batches')} batches and "
            f"{r.end.get('probes')} probes, the replay {r.batches} and {r.probes}"
        )
    if r.probes < MIN_PROBES:
        problems.append(f"{name}: only {r.probes} probes (at least {MIN_PROBES} expected)")
    if r.hit_tokens == 0:
        problems.append(f"{name}: vLLM never hit, so nothing was tested")
    for which, totals in (("configured", r.unapplied), ("learning", r.learned_unapplied)):
        unapplied = {k: totals[k] for k in UNAPPLIED if totals[k]}
        if unapplied:
            problems.append(f"{name}: the {which} router did not apply every event: {unapplied}")
    if r.unapplied["settings_conflicts"]:
        problems.append(
            f"{name}: {r.unapplied['settings_conflicts']} events contradict the engines' settings"
        )
    if r.misses:
        problems.append(
            f"{name}: {len(r.misses)} of {r.probes} probes differ from vLLM's own hit; the first:\n  "
            + "\n  ".join(r.misses[:SHOWN_MISSES])
        )
    if r.learned_misses:
        problems.append(
            f"{name}: {len(r.learned_misses)} probes answered otherwise with only the unlearnable "
            "settings set; the first:\n  " + "\n  ".join(r.learned_misses[:SHOWN_MISSES])
        )
    return problems


FILES = _files()


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, id=p.stem) for p in FILES] or [pytest.param(None, id="no-output")],
)
def test_mirror_equals_vllms_hit_for_every_probe(path: Optional[Path]) -> None:
    """Every probe of a run: the configured mirror's reusable tokens equal vLLM's hit; the
    learning mirror answers the same; every event applies; the end line's counts match."""
    if path is None:
        pytest.fail(_no_files_message())
    r = replay(path)
    problems = _problems(path, r)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def test_output_holds_every_family() -> None:
    """The directory holds runs of every family, so a partial harness output cannot pass."""
    if not FILES:
        pytest.fail(_no_files_message())
    families = set()
    for p in FILES:
        with p.open("rb") as f:
            families.add(Header.parse(json.loads(f.readline())).family)
    assert sorted(families) == FAMILIES, (
        f"{len(FILES)} runs in {_output_dir()}: families {sorted(families)}, "
        f"expected {FAMILIES}"
    )
