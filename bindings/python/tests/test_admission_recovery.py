"""Admission after a slow spell, driven as a gateway drives the router: first tokens take
3 s against a 2 s target for 4 s, then every request in flight completes and first tokens
come after 0.05 s. The router admits again within the target's span, and soon at the full
rate. The host's clock is virtual here (``now_s=``), so the run takes no wall time."""

from __future__ import annotations

import heapq

import prefix_router as pr

TTFT_TARGET_S = 2.0
TPOT_TARGET_S = 0.1
OUTPUT_TOKENS = 64
RATE = 16.0  # requests a second


def prompt(seed: int) -> list[int]:
    """2,000 tokens: the first 1,600 of one of 8 families, then the request's own."""
    family = seed % 8
    head = [family * 1_000_003 + i for i in range(1_600)]
    return head + [(seed * 2_654_435_761 ^ i) & 0xFFFF_FFFF for i in range(1_600, 2_000)]


def run(router: pr.Router, seconds: float, slow_until: float, clock_given: bool):
    """Admitted and refused counts per whole second, and the refusals (time, error)."""
    admitted = [0] * (int(seconds) + 1)
    refused = [0] * (int(seconds) + 1)
    sheds = []
    flight: dict[int, tuple[pr.Decision, float]] = {}
    events: list[tuple[float, int, int]] = []  # (time, step, request): 0 first, 1 end
    recovered = False
    for k in range(int(RATE * seconds)):
        t = k / RATE
        while events and events[0][0] <= t:
            _, step, i = heapq.heappop(events)
            if i not in flight:
                continue
            d, ttft = flight[i]
            if step == 0:
                router.first_token(d, elapsed_s=ttft)
            else:
                router.tokens_after(d, OUTPUT_TOKENS - 1, 0.01 * (OUTPUT_TOKENS - 1))
                router.complete(d)
                del flight[i]
        if not recovered and t >= slow_until:
            recovered = True
            for d, _ in flight.values():
                router.complete(d)
            flight.clear()
        kwargs = {"now_s": t} if clock_given else {}
        try:
            d = router.route(
                prompt(k),
                ttft_target_s=TTFT_TARGET_S,
                tpot_target_s=TPOT_TARGET_S,
                expected_output=OUTPUT_TOKENS,
                **kwargs,
            )
        except pr.Shed as shed:
            refused[int(t)] += 1
            sheds.append((t, shed))
            continue
        admitted[int(t)] += 1
        ttft = 3.0 if t < slow_until else 0.05
        flight[k] = (d, ttft)
        heapq.heappush(events, (t + ttft, 0, k))
        heapq.heappush(events, (t + ttft + 0.01 * (OUTPUT_TOKENS - 1), 1, k))
    return admitted, refused, sheds


def test_admission_reopens_after_a_slow_spell() -> None:
    router = pr.Router(4)
    admitted, refused, sheds = run(router, 14.0, 4.0, clock_given=True)
    assert sum(refused) > 0, "the slow spell refused nothing"
    assert admitted[4] + admitted[5] > 0, (admitted, refused, sheds[-1:])
    for second in range(9, 14):
        assert refused[second] == 0, (second, admitted, refused, sheds[-1:])
    for t, shed in sheds:
        retry = shed.retry_after_s
        assert retry is None or retry <= 3.0 + TTFT_TARGET_S, (t, shed)


def test_a_fleet_that_keeps_up_is_refused_nothing() -> None:
    router = pr.Router(4)
    _, refused, sheds = run(router, 14.0, 0.0, clock_given=True)
    assert sum(refused) == 0, sheds[:1]


def test_without_a_time_the_router_reads_the_monotonic_clock() -> None:
    """A host that gives no ``now_s`` is timed by ``time.monotonic()``: the router's clock
    moves, and a fleet that keeps up is refused nothing."""
    router = pr.Router(4)
    _, refused, sheds = run(router, 4.0, 0.0, clock_given=False)
    assert sum(refused) == 0, sheds[:1]
    assert router.fleet_signals().at_s > 0.0
