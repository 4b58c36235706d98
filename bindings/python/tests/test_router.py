"""The package as a host uses it: routing, learning, the fleet, events, errors, threads."""

from __future__ import annotations

import array
import math
import threading

import numpy as np
import pytest

import prefix_router as pr
from reference_hash import sha256_chain, xxh3_chain

SYSTEM = list(range(2_000))


def prompt(tail: int, system: list[int] = SYSTEM) -> list[int]:
    return system + [100_000 + tail, 7, 7]


# ------------------------------------------------------------------ routing round-trips


def test_the_cached_prefix_wins_and_a_decision_completes_once() -> None:
    router = pr.Router(4)
    first = router.route(prompt(0))
    assert first.cached_tokens == 0 and first.prompt_tokens == 2_003
    router.complete(first)
    router.complete(first)  # a no-op
    assert first.completed
    again = router.route(prompt(1))
    assert again.worker == first.worker
    assert again.cached_tokens == 2_000  # 125 full blocks of 16
    assert again.predicted_ttft_s < first.predicted_ttft_s
    router.complete(again)
    signals = router.fleet_signals()
    assert signals.routed == 2
    assert sum(w.requests for w in signals.workers) == 0


def test_a_decision_is_a_context_manager_that_completes_on_exit() -> None:
    router = pr.Router(2)
    with router.route(prompt(0)) as d:
        assert not d.completed
        assert router.fleet_signals().workers[d.worker].requests == 1
    assert d.completed
    assert all(w.requests == 0 for w in router.fleet_signals().workers)
    with pytest.raises(RuntimeError):
        with router.route(prompt(1)) as d2:
            raise RuntimeError("the host failed mid-stream")
    assert d2.completed


@pytest.mark.parametrize(
    "make",
    [
        list,
        tuple,
        lambda t: array.array("I", t),
        lambda t: array.array("q", t),
        lambda t: np.asarray(t, dtype=np.uint32),
        lambda t: np.asarray(t, dtype=np.int64),
        lambda t: memoryview(array.array("I", t)),
        lambda t: np.repeat(np.asarray(t, dtype=np.uint32), 2)[::2],  # not contiguous
    ],
)
def test_every_token_container_routes_as_a_list_does(make) -> None:
    tokens = prompt(3)
    a, b = pr.Router(4), pr.Router(4)
    want = a.route(tokens)
    got = b.route(make(tokens))
    assert (got.worker, got.prompt_tokens, got.cached_tokens) == (want.worker, 2_003, 0)
    again = b.route(make(tokens))
    assert again.cached_tokens == 2_000 and again.worker == got.worker


def test_every_policy_routes_and_names_itself() -> None:
    for policy in ["balanced", "cache_aware", "round_robin", "least_loaded", "power_of_two", "consistent_hash", "affinity"]:
        router = pr.Router(3, policy)
        assert router.policy == policy
        seen = set()
        for i in range(12):
            with router.route(prompt(i, system=list(range(i * 100, i * 100 + 64))), session=f"s{i % 4}") as d:
                assert 0 <= d.worker < 3
                seen.add(d.worker)
        assert seen, policy


def test_a_miss_is_priced_by_the_fleet_unless_fixed() -> None:
    fleet = pr.BalancedConfig()
    assert fleet.miss_weight is None and fleet.miss_weight_max == 30.0
    assert pr.LoadConfig().busy_horizon_s == 0.5
    fixed = pr.BalancedConfig(miss_weight=3.0)
    assert fixed.miss_weight == 3.0 and fixed.miss_weight_max == 3.0
    for config in [fleet, fixed]:
        router = pr.Router(2, balanced=config)
        router.complete(router.route(SYSTEM))
        assert router.route(SYSTEM).cached_tokens == 2_000


def test_salts_and_lora_names_keep_namespaces_apart() -> None:
    router = pr.Router(2)
    router.complete(router.route(SYSTEM, lora="adapter-a"))
    assert router.route(SYSTEM, lora="adapter-a").cached_tokens == 2_000
    assert router.route(SYSTEM, lora="adapter-b").cached_tokens == 0
    assert router.route(SYSTEM, salt=pr.namespace_salt("adapter-a")).cached_tokens == 2_000
    assert router.route(SYSTEM, cache_salt="tenant").cached_tokens == 0


def test_an_explanation_lists_every_candidate_and_its_cost() -> None:
    router = pr.Router(3)
    router.complete(router.route(prompt(0)))
    d = router.route(prompt(1), explain=True)
    e = d.explanation
    assert e is not None and e.policy == "balanced" and e.chosen == d.worker
    assert {c.worker for c in e.candidates} <= {0, 1, 2} and len(e.candidates) >= 2
    chosen = next(c for c in e.candidates if c.worker == d.worker)
    assert chosen.cached_tokens == 2_000
    assert chosen.total_cost == pytest.approx(sum(v for _, v in chosen.terms))
    assert set(chosen.cost) == {name for name, _ in chosen.terms}
    assert "balanced chose worker" in str(e)
    assert router.route(prompt(2)).explanation is None


def test_ranks_are_targets_of_their_endpoint() -> None:
    router = pr.Router(2, ranks=4)
    assert len(router.workers()) == 8 and router.ranks == 4
    assert router.target(1, 2) == 6
    d = router.route(prompt(0))
    assert d.worker == router.target(d.endpoint, d.rank)


# ------------------------------------------------------------------ learning and load


def test_first_tokens_teach_the_router_a_slower_worker() -> None:
    """A worker whose first tokens come 5x later than predicted is predicted slower."""
    router = pr.Router(2, load=pr.LoadConfig(learning_rate=0.5))
    before = None
    for i in range(40):
        tokens = list(range(i * 10_000, i * 10_000 + 1_024))
        d = router.route(tokens, now_s=float(i))
        if d.worker == 0:
            before = before or d.predicted_ttft_s
            router.first_token(d, elapsed_s=5 * d.predicted_ttft_s)
            router.tokens_after(d, 100, 100 * 5 * d.predicted_tpot_s)
        else:
            router.first_token(d, elapsed_s=d.predicted_ttft_s)
            router.tokens_after(d, 100, 100 * d.predicted_tpot_s)
        router.complete(d)
    assert before is not None
    # A fresh prompt of the same length, on worker 0 alone, is now predicted slower.
    router.drain(1)
    with router.route(list(range(900_000, 901_024)), now_s=50.0) as d:
        assert d.worker == 0
        assert d.predicted_ttft_s > 2 * before, (d.predicted_ttft_s, before)


def test_reported_load_steers_new_work_away() -> None:
    router = pr.Router(2)
    router.report_load(0, pr.EngineLoad(waiting=50, running=200, measured_at_s=1.0, kv_usage=0.95))
    router.report_load(1, pr.EngineLoad(waiting=0, running=0, measured_at_s=1.0, kv_usage=0.0))
    with router.route(list(range(512)), now_s=1.5) as d:
        assert d.worker == 1


def test_admission_sheds_with_its_figures_and_retry_after() -> None:
    router = pr.Router(1, load=pr.LoadConfig(prefill_tokens_per_s=4_000.0))
    held = [router.route(list(range(i * 5_000, i * 5_000 + 4_000))) for i in range(3)]
    with pytest.raises(pr.Shed) as refused:
        router.route(list(range(90_000, 94_000)), ttft_target_s=2.0)
    shed = refused.value
    assert isinstance(shed, pr.PrefixRouterError)
    assert shed.priority == "standard" and shed.limit == "queue"
    assert shed.target_s == pytest.approx(2.0)
    assert shed.best_ttft_s > 2.0 and shed.best_worker == 0
    assert shed.retry_after_s is not None and shed.retry_after_s > 0
    assert shed.gate == "model" and shed.threshold_s == 2.0 and shed.measured_s > 2.0
    with pytest.raises(pr.Shed) as oversized:
        router.route(list(range(200_000, 210_000)), ttft_target_s=1.0)
    assert oversized.value.limit == "prompt" and oversized.value.retry_after_s is None
    # Critical requests are never refused.
    router.complete(router.route(list(range(95_000, 99_000)), ttft_target_s=2.0, priority="critical"))
    assert router.fleet_signals().shed_by_limit["queue"] == 1
    assert router.fleet_signals().shed_by_gate == {
        "model": 1, "prompt": 1, "prefill_window": 0, "decode_bound": 0
    }
    assert router.fleet_signals().shed_by_priority["standard"] == 2
    for d in held:
        router.complete(d)


def test_workers_come_and_go() -> None:
    router = pr.Router(2)
    router.add_worker(5)
    assert router.workers() == [0, 1, 5]
    router.drain(0)
    router.drain(1)
    for i in range(5):
        with router.route(prompt(i)) as d:
            assert d.worker == 5
    router.set_available(0, True)
    router.remove_worker(5)
    router.remove_worker(1)
    assert router.route(prompt(9)).worker == 0
    router.remove_worker(0)
    with pytest.raises(pr.NoWorkers):
        router.route(prompt(10))


def test_set_profile_and_engine_settings_are_checked() -> None:
    router = pr.Router(2)
    router.set_profile(1, speed=2.0, kv_capacity_tokens=1_000_000)
    router.set_engine_settings(0, full_reports=True, host_chunk_blocks=4, groups=[(1, "sliding_window", 1024)])
    with pytest.raises(pr.InvalidConfig) as bad:
        router.set_profile(1, speed=0.0)
    assert bad.value.field == "speed"
    with pytest.raises(pr.UnknownWorker) as unknown:
        router.set_profile(7)
    assert unknown.value.worker == 7


# ------------------------------------------------------------------ keeping the mirror true


def test_snapshots_and_feedback_correct_the_mirror() -> None:
    router = pr.Router(2)
    router.replace_worker_cache(1, [SYSTEM])
    assert router.reusable_tokens(1, prompt(0)) == 2_000
    with router.route(prompt(0)) as d:
        assert d.worker == 1 and d.cached_tokens == 2_000
    # The worker had only 512 tokens of a longer prompt sharing the first 1,024: the
    # mirror drops what hangs below them, then holds that prompt whole.
    longer = list(range(4_000))
    router.replace_worker_cache(1, [longer])
    router.report_cached(1, longer[:1_024] + [999_999] * 64, 512)
    assert router.reusable_tokens(1, longer) == 1_024
    router.replace_worker_cache(1, [])
    assert router.reusable_tokens(1, prompt(0)) == 0
    assert router.memory_bytes() > 0


def test_events_need_a_mirror_and_bad_payloads_are_errors() -> None:
    with pytest.raises(pr.InvalidConfig) as no_mirror:
        pr.Router(2, "round_robin").apply_vllm_events(0, b"\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x90\xc0")
    assert no_mirror.value.field == "policy"
    router = pr.Router(2)
    with pytest.raises(pr.DecodeError):
        router.apply_vllm_events(0, b"not msgpack")
    # An empty batch (ts, no events, no rank) applies cleanly, in order.
    empty = b"\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x90\xc0"
    assert router.apply_vllm_events(0, empty, seq=4).sequence == "in_order"


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "call, error, builtin",
    [
        (lambda: pr.Router(2, block_size=0), pr.InvalidBlockSize, ValueError),
        (lambda: pr.Router(2, "fastest"), pr.InvalidConfig, ValueError),
        (lambda: pr.Router(2, hash="md5"), pr.InvalidConfig, ValueError),
        (lambda: pr.Router(2, "round_robin", balanced=pr.BalancedConfig()), pr.InvalidConfig, ValueError),
        (lambda: pr.BalancedConfig(alpha=2.0), pr.InvalidConfig, ValueError),
        (lambda: pr.BalancedConfig(miss_weight=0.5), pr.InvalidConfig, ValueError),
        (lambda: pr.LoadConfig(busy_horizon_s=0.0), pr.InvalidConfig, ValueError),
        (lambda: pr.LoadConfig(prefill_tokens_per_s=-1.0), pr.InvalidConfig, ValueError),
        (lambda: pr.AdmissionConfig(sheddable_share=0.0), pr.InvalidConfig, ValueError),
        (lambda: pr.EngineLoad(waiting=0, running=0, measured_at_s=0.0, kv_usage=1.5), pr.InvalidConfig, ValueError),
        (lambda: pr.Router(2, ranks=0), pr.InvalidConfig, ValueError),
        (lambda: pr.Router(2).add_worker(1), pr.WorkerExists, ValueError),
        (lambda: pr.Router(2).add_worker(1 << 20), pr.WorkerOutOfRange, ValueError),
        (lambda: pr.Router(2).remove_worker(3), pr.UnknownWorker, LookupError),
        (lambda: pr.Router(2).add_worker(-1), pr.InvalidConfig, ValueError),
        (lambda: pr.Router(2).route([1, 2, -3]), pr.InvalidTokens, ValueError),
        (lambda: pr.Router(2).route(np.zeros((2, 2), dtype=np.uint32)), pr.InvalidTokens, ValueError),
        (lambda: pr.Router(2).route(np.array([1, 1 << 40], dtype=np.int64)), pr.InvalidTokens, ValueError),
        (lambda: pr.Router(2).route([1], priority="urgent"), pr.InvalidConfig, ValueError),
        (lambda: pr.Router(2).route([1], ttft_target_s=0.0), pr.InvalidConfig, ValueError),
        (lambda: pr.Router(2).route([1], salt=b"x", lora="a"), pr.InvalidConfig, ValueError),
        (lambda: pr.Router(2).route(SYSTEM, explain=True).cached_tokens_at("gpu"), pr.InvalidConfig, ValueError),
        (lambda: pr.Router(2).first_token(pr.Router(2).route([1]), elapsed_s=-1.0), pr.InvalidConfig, ValueError),
        (lambda: pr.Router(2).complete(pr.Router(2).route([1])), pr.InvalidConfig, ValueError),
        (lambda: pr.Router(1, ranks=2).target(0, 2), pr.InvalidRank, ValueError),
        (lambda: pr.PairRouter(["prefill", "sideways"]), pr.InvalidConfig, ValueError),
        (lambda: pr.PrefixHasher(0), pr.InvalidBlockSize, ValueError),
    ],
)
def test_every_error_is_its_exception(call, error, builtin) -> None:
    with pytest.raises(error) as raised:
        call()
    assert isinstance(raised.value, pr.PrefixRouterError)
    assert isinstance(raised.value, builtin)
    assert str(raised.value)  # a message that says what is wrong
    assert type(raised.value).__module__ == "prefix_router"


def test_wrong_types_are_type_errors() -> None:
    router = pr.Router(2)
    for bad in ["some text", b"bytes", [1.5, 2.0], np.zeros(3, dtype=np.float32), [None]]:
        with pytest.raises(TypeError):
            router.route(bad)


# ------------------------------------------------------------------ threads


def test_threads_routing_at_once_agree_with_one_thread() -> None:
    """Eight threads route and complete 400 requests over 20 shared prefixes; the fleet's
    counts and the mirror end as one thread's serial run of the same requests leaves them."""
    requests = [prompt(i, system=list(range((i % 20) * 1_000, (i % 20) * 1_000 + 256))) for i in range(400)]

    def serve(router: pr.Router, chunk: list[list[int]], cached: list[int]) -> None:
        for tokens in chunk:
            with router.route(np.asarray(tokens, dtype=np.uint32)) as d:
                cached.append(d.cached_tokens)
                router.first_token(d)

    serial, cached_serial = pr.Router(4), []
    serve(serial, requests, cached_serial)

    shared, cached_threads = pr.Router(4), []
    threads = [threading.Thread(target=serve, args=(shared, requests[i::8], cached_threads)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)

    for router, cached in [(serial, cached_serial), (shared, cached_threads)]:
        signals = router.fleet_signals()
        assert signals.routed == 400 and len(cached) == 400
        assert all(w.requests == 0 for w in signals.workers)
        assert sum(w.routed for w in signals.workers) == 400
    # Every prefix is cached somewhere in both, and at most 20 first routes missed it.
    for tokens in requests[:20]:
        best = max(shared.reusable_tokens(w, tokens) for w in shared.workers())
        assert best == 256
    assert sum(c == 0 for c in cached_serial) == 20
    assert sum(c == 0 for c in cached_threads) <= 20 + 8 * 4


def test_route_releases_the_gil() -> None:
    """A thread routing long prompts does not hold the GIL: another thread keeps counting."""
    router = pr.Router(16)
    tokens = np.arange(200_000, dtype=np.uint32)
    stop = threading.Event()
    ticks = [0]

    def count() -> None:
        while not stop.is_set():
            ticks[0] += 1

    counter = threading.Thread(target=count)
    counter.start()
    for _ in range(20):
        router.complete(router.route(tokens))
    stop.set()
    counter.join()
    assert ticks[0] > 0


# ------------------------------------------------------------------ hashing


GOLDEN = [  # (algorithm, block size, first three hashes and the last), tests/hash_golden.rs
    ("xxh3", 16, [0x788B2E11E2062219, 0x1014EBDFC533AF8F, 0xA54128CA9FFB38C3, 0x751C458AA5BB520C]),
    ("xxh3", 64, [0x556A3654902D70A5, 0xEF0340D82DC093A3, 0xDEA217CFFDCE109F, 0x8893B67E512AAC80]),
    ("sha256", 16, [0x5C89EA4867236850, 0x9603FA524C27FA44, 0xD6DCB61286A388D0, 0xB53CCCF623F8E030]),
]


@pytest.mark.parametrize("algorithm, block_size, expected", GOLDEN)
def test_hashes_are_the_crates_golden_values(algorithm: str, block_size: int, expected: list[int]) -> None:
    tokens = list(range(1_200))
    hashes = pr.PrefixHasher(block_size, hash=algorithm).hash(tokens)
    assert len(hashes) == 1_200 // block_size
    assert hashes[:3] + hashes[-1:] == expected
    reference = xxh3_chain if algorithm == "xxh3" else sha256_chain
    assert reference(tokens, block_size) == hashes
    salted = pr.PrefixHasher(block_size, hash=algorithm).hash(tokens, salt=b"tenant")
    assert reference(tokens, block_size, salt=b"tenant") == salted


# ------------------------------------------------------------------ pairs


def test_the_pair_router_splits_long_prompts_and_completes_both_sides() -> None:
    pairs = pr.PairRouter(["prefill", "decode", "prefill", "decode"])
    assert [pairs.role(w) for w in range(4)] == ["prefill", "decode", "prefill", "decode"]
    with pairs.route(list(range(16_384)), expected_output=128) as pair:
        assert pair.decode.worker in (1, 3)
        if pair.is_split:
            assert pair.prefill is not None and pair.prefill.worker in (0, 2)
            pairs.prefill_done(pair)
        pairs.first_token(pair, elapsed_s=0.5)
        pairs.tokens_after(pair, 128, 1.0)
    assert all(w.requests == 0 for w in pairs.fleet_signals().workers)
    never = pr.PairRouter(["both", "both"], decider="never")
    with never.route(list(range(4_096))) as aggregated:
        assert not aggregated.is_split and aggregated.prefill is None
    with pytest.raises(pr.InvalidConfig):
        never.complete(pairs.route(list(range(64))))
    assert math.isfinite(aggregated.decode.predicted_ttft_s)


def test_the_package_docstring_example_runs() -> None:
    import doctest

    result = doctest.testmod(pr)
    assert result.attempted > 0 and result.failed == 0, result


def test_the_package_readme_examples_run() -> None:
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


def test_the_former_names_still_work_with_a_deprecation_warning() -> None:
    router = pr.Router(2)
    with pytest.warns(DeprecationWarning, match="ttft_target_s"):
        d = router.route(prompt(0), ttft_target=2.0, now_s=1.0)
    router.complete(d)
    with pytest.warns(DeprecationWarning, match="now_s"):
        d = router.route(prompt(0), now=2.0)
    with pytest.warns(DeprecationWarning, match="elapsed_s"):
        router.first_token(d, elapsed=0.05)
    with pytest.warns(DeprecationWarning, match="elapsed_s"):
        router.tokens_after(d, 16, elapsed=0.16)
    router.complete(d)
    with pytest.raises(pr.InvalidConfig):
        router.route(prompt(1), ttft_target=2.0, ttft_target_s=2.0)
    with pytest.raises(pr.InvalidConfig):
        router.tokens_after(d, 16)
    with pytest.warns(DeprecationWarning, match="ttl_routes"):
        pr.Router(2, ttl=1_000)


def test_every_admission_setting_is_reachable_with_the_crates_defaults() -> None:
    default = pr.AdmissionConfig()
    assert default.initial_decode_window == 4
    config = pr.AdmissionConfig(initial_decode_window=1)
    assert config.initial_decode_window == 1
    router = pr.Router(1, load=pr.LoadConfig(admission=config))
    first = router.route(prompt(0), tpot_target_s=0.1, now_s=0.0)
    router.first_token(first, elapsed_s=0.01)
    # With a window of one, a second request before any progress report is refused.
    with pytest.raises(pr.Shed) as refused:
        router.route(prompt(1), tpot_target_s=0.1, now_s=0.1)
    assert refused.value.gate == "decode_bound"
    assert refused.value.retry_after_s == refused.value.retry_after
