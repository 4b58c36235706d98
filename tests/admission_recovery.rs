//! Admission after a slow spell: a fleet that was slow (first tokens after 3 s against a
//! 2 s target) and then recovers is admitted to again, within the time-to-first-token
//! target's span, and soon at the full rate of the fast phase. Driven as a host drives the
//! router: its own clock on every request, first tokens, progress and completions reported
//! as they come.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use prefix_router::{BalancedRouter, Error, Priority, RouteDecision, RouteRequest, Router, Shed};

const TTFT_TARGET_S: f64 = 2.0;
const TPOT_TARGET_S: f64 = 0.1;
const FAMILIES: u32 = 8;
const PROMPT_TOKENS: u32 = 2_000;
const OUTPUT_TOKENS: u32 = 64;

/// A 2,000-token prompt of family `seed % 8`: the family's first 1,600 tokens, then its own.
fn prompt(seed: u32) -> Vec<u32> {
    let family = seed % FAMILIES;
    (0..PROMPT_TOKENS)
        .map(|i| {
            if i < 1_600 {
                family * 1_000_003 + i
            } else {
                seed.wrapping_mul(2_654_435_761) ^ i
            }
        })
        .collect()
}

/// A standard request for `tokens` asking for admission at the targets, expecting `output`
/// tokens, at time `at` (seconds) when given.
fn standard(tokens: &[u32], at: Option<f64>, output: u32) -> RouteRequest<'_> {
    let request = RouteRequest::new(tokens)
        .with_ttft_target(Duration::from_secs_f64(TTFT_TARGET_S))
        .with_tpot_target(Duration::from_secs_f64(TPOT_TARGET_S))
        .with_priority(Priority::Standard)
        .with_expected_output(output);
    match at {
        Some(t) => request.with_time(Duration::from_secs_f64(t)),
        None => request,
    }
}

/// How the fleet serves a request routed at some time: its first token after `ttft_s`, its
/// 64 output tokens `tpot_s` apart after that.
#[derive(Clone, Copy, Debug)]
struct Service {
    ttft_s: f64,
    tpot_s: f64,
}

const SLOW: Service = Service {
    ttft_s: 3.0,
    tpot_s: 0.01,
};
const FAST: Service = Service {
    ttft_s: 0.05,
    tpot_s: 0.01,
};

/// What happens to a request in flight: its first token, its progress (cumulative output
/// tokens after the first), its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    FirstToken,
    Progress(u32),
    Complete,
}

/// Every how many output tokens a stream reports its progress, as a gateway reading it does.
const PROGRESS_EVERY: u32 = 16;

/// What one run saw: per whole second of the host's clock, requests admitted and refused,
/// and the refusals.
#[derive(Debug, Default)]
struct Run {
    admitted: Vec<u32>,
    refused: Vec<u32>,
    sheds: Vec<(f64, Shed)>,
}

/// Routes one request every `1 / rate` seconds for `seconds`, served as `service(t)` says
/// for a request routed at `t`, its first token and its progress every
/// [`PROGRESS_EVERY`] tokens reported as they come; at `recover_at` every request in flight
/// completes at once (the slow spell ends). The router's clock is the request's time when
/// `timed`, else the router is given none.
fn run(
    router: &BalancedRouter,
    (rate, seconds): (f64, f64),
    service: impl Fn(f64) -> Service,
    (recover_at, timed): (f64, bool),
) -> Run {
    let mut out = Run {
        admitted: vec![0; seconds.ceil() as usize + 1],
        refused: vec![0; seconds.ceil() as usize + 1],
        sheds: Vec::new(),
    };
    let mut flight: Vec<Option<(RouteDecision, Service)>> = Vec::new();
    // (time in µs, step, request) in time order.
    let mut events: BinaryHeap<Reverse<(u64, Step, usize)>> = BinaryHeap::new();
    let us = |s: f64| (s * 1e6).round() as u64;
    let mut recovered = false;
    let arrivals = (rate * seconds) as u32;
    for k in 0..arrivals {
        let t = f64::from(k) / rate;
        // Everything due before this arrival happens first.
        while let Some(&Reverse((at, step, i))) = events.peek() {
            if at > us(t) {
                break;
            }
            events.pop();
            let Some((d, s)) = flight[i].as_ref() else {
                continue;
            };
            match step {
                Step::FirstToken => router.first_token_after(d, Duration::from_secs_f64(s.ttft_s)),
                Step::Progress(tokens) => router.tokens_after(
                    d,
                    tokens,
                    Duration::from_secs_f64(s.tpot_s * f64::from(tokens)),
                ),
                Step::Complete => {
                    router.complete(d);
                    flight[i] = None;
                }
            }
        }
        if !recovered && t >= recover_at {
            recovered = true;
            for slot in &mut flight {
                if let Some((d, _)) = slot.take() {
                    router.complete(&d);
                }
            }
        }
        let tokens = prompt(k);
        let request = standard(&tokens, timed.then_some(t), OUTPUT_TOKENS);
        let second = t as usize;
        match router.route(&request) {
            Ok(d) => {
                out.admitted[second] += 1;
                let s = service(t);
                let i = flight.len();
                let first = t + s.ttft_s;
                let last = first + s.tpot_s * f64::from(OUTPUT_TOKENS - 1);
                events.push(Reverse((us(first), Step::FirstToken, i)));
                let reports = (PROGRESS_EVERY..OUTPUT_TOKENS - 1).step_by(PROGRESS_EVERY as usize);
                for tokens in reports.chain([OUTPUT_TOKENS - 1]) {
                    let at = first + s.tpot_s * f64::from(tokens);
                    events.push(Reverse((us(at), Step::Progress(tokens), i)));
                }
                events.push(Reverse((us(last), Step::Complete, i)));
                flight.push(Some((d, s)));
            }
            Err(Error::Shed(shed)) => {
                out.refused[second] += 1;
                out.sheds.push((t, shed));
            }
            Err(e) => panic!("{e}"),
        }
    }
    out
}

/// The slow spell of 4 s at 16 requests a second, then 10 s of a fast fleet at the same
/// rate; the router told the time when `timed`.
fn slow_then_fast(router: &BalancedRouter, timed: bool) -> Run {
    run(
        router,
        (16.0, 14.0),
        |t| if t < 4.0 { SLOW } else { FAST },
        (4.0, timed),
    )
}

/// Every request from second `from` on was admitted.
fn assert_full_rate_from(out: &Run, from: usize) {
    for second in from..out.refused.len() {
        assert_eq!(
            out.refused[second],
            0,
            "refusals at {second} s: admitted {:?} refused {:?}, last refusal {:?}",
            out.admitted,
            out.refused,
            out.sheds.last()
        );
    }
}

#[test]
fn admission_reopens_after_a_slow_spell() {
    let router = BalancedRouter::new(4).expect("router");
    let out = slow_then_fast(&router, true);
    // The slow spell is seen: some requests are refused while first tokens take 3 s.
    let refused: u32 = out.refused.iter().sum();
    assert!(refused > 0, "the slow spell refused nothing: {out:?}");
    // Within the target's span of the recovery (4 s to 6 s) a request is admitted again.
    assert!(
        out.admitted[4] + out.admitted[5] > 0,
        "nothing admitted in the 2 s after recovery: admitted {:?} refused {:?}, last refusal {:?}",
        out.admitted,
        out.refused,
        out.sheds.last()
    );
    // From two seconds after recovery every request is admitted: the fast phase's rate.
    assert_full_rate_from(&out, 6);
    // No refusal asks to wait longer than waiting can help: the longest a first token took
    // plus the target.
    for (t, shed) in &out.sheds {
        let retry = shed.retry_after.map_or(0.0, |d| d.as_secs_f64());
        assert!(
            retry <= SLOW.ttft_s + TTFT_TARGET_S,
            "at {t} s: retry after {retry} s: {shed}"
        );
    }
}

/// A spell in which the engines stall whole, their decodes as much as their prefill: first
/// tokens after 3 s and 0.3 s a token (three times the target) for 4 s after 4 s of a fast
/// fleet. What the gates learned from it (the prefill factor, the admitted prefill's share
/// priced at it) is unlearned once first tokens and progress are fast again: every request
/// is admitted from two seconds after the recovery on.
#[test]
fn admission_reopens_after_a_spell_that_stalls_decodes_too() {
    const STALLED: Service = Service {
        ttft_s: 3.0,
        tpot_s: 0.3,
    };
    let router = BalancedRouter::new(4).expect("router");
    let out = run(
        &router,
        (16.0, 18.0),
        |t| {
            if (4.0..8.0).contains(&t) {
                STALLED
            } else {
                FAST
            }
        },
        (8.0, true),
    );
    let refused: u32 = out.refused[..8].iter().sum();
    assert!(refused > 0, "the spell refused nothing: {out:?}");
    assert!(
        out.admitted[8] > 0,
        "nothing admitted in the second after recovery: {out:?}"
    );
    assert_full_rate_from(&out, 10);
}

#[test]
fn a_fleet_that_keeps_up_is_refused_nothing() {
    let router = BalancedRouter::new(4).expect("router");
    let out = run(&router, (16.0, 14.0), |_| FAST, (f64::INFINITY, true));
    assert_eq!(
        out.refused.iter().sum::<u32>(),
        0,
        "needless refusals: {:?}",
        out.sheds.first()
    );
}

/// A host that never tells the router the time: the gates read no span (no admitted
/// prefill rate, no wait), so the model's check and the factors decide, and the router
/// still admits again once the fleet recovers.
#[test]
fn a_router_never_told_the_time_recovers_too() {
    let router = BalancedRouter::new(4).expect("router");
    let out = slow_then_fast(&router, false);
    assert_full_rate_from(&out, 6);
    assert_eq!(
        router.fleet_signals().at,
        Duration::ZERO,
        "the clock never moved"
    );
}

/// A fleet whose decodes all stall at once for `STALL_S` at `STALL_AT_S` while prefill goes
/// on (an engine that runs a burst of prompts before its decodes, as SGLang's scheduler
/// does by default) and then go on. Every stream reports its progress every 16 tokens, so
/// the stall's reports come together, some forty a worker, each showing its last 16 tokens
/// over ten times slower than predicted; yet every first token comes within 0.05 s and
/// every answer within 0.02 s a token: a fleet that serves every request within its targets
/// without admission.
const STALL_AT_S: f64 = 8.0;
const STALL_S: f64 = 2.0;
/// Requests a second and output tokens of the stalled fleet's requests: some forty streams
/// decoding on each of its four workers.
const STALL_RATE: f64 = 64.0;
const STALL_OUTPUT: u32 = 256;

/// A time on the fleet's decode clock, which stops during the stall, as the host's time.
fn through_stall(t: f64) -> f64 {
    if t < STALL_AT_S { t } else { t + STALL_S }
}

/// A host's time as the decode clock reads it (a time within the stall reads its start).
fn decode_clock(t: f64) -> f64 {
    if t < STALL_AT_S {
        t
    } else {
        (t - STALL_S).max(STALL_AT_S)
    }
}

/// A request in flight: its decision, when it was routed and when its first token came.
struct Flight {
    decision: RouteDecision,
    routed: f64,
    first: f64,
}

/// Routes `STALL_RATE` requests a second for `seconds`, each served as `FAST` on the decode
/// clock, its first token and its progress every 16 tokens reported as they come; returns
/// the refusals.
fn run_with_stall(router: &BalancedRouter, seconds: f64) -> Vec<(f64, Shed)> {
    // (time in µs, push order, request, output tokens after the first; 0: the first token).
    let mut events: BinaryHeap<Reverse<(u64, u32, usize, u32)>> = BinaryHeap::new();
    let us = |s: f64| (s * 1e6).round() as u64;
    let mut flight: Vec<Option<Flight>> = Vec::new();
    let mut sheds = Vec::new();
    let mut order = 0;
    for k in 0..(STALL_RATE * seconds) as u32 {
        let t = f64::from(k) / STALL_RATE;
        while let Some(&Reverse((at, _, i, tokens))) = events.peek() {
            if at > us(t) {
                break;
            }
            events.pop();
            let Some(f) = flight[i].as_ref() else {
                continue;
            };
            let now = at as f64 * 1e-6;
            if tokens == 0 {
                router.first_token_after(&f.decision, Duration::from_secs_f64(now - f.routed));
            } else {
                router.tokens_after(&f.decision, tokens, Duration::from_secs_f64(now - f.first));
            }
            if tokens == STALL_OUTPUT - 1 {
                router.complete(&f.decision);
                flight[i] = None;
            }
        }
        let tokens = prompt(k);
        let request = standard(&tokens, Some(t), STALL_OUTPUT);
        match router.route(&request) {
            Ok(decision) => {
                let i = flight.len();
                // Prefill runs through the stall; the decodes wait for it.
                let first = t + FAST.ttft_s;
                let first_decode = decode_clock(first);
                order += 1;
                events.push(Reverse((us(first), order, i, 0)));
                for tokens in (16..STALL_OUTPUT).step_by(16).chain([STALL_OUTPUT - 1]) {
                    let at =
                        through_stall(first_decode + FAST.tpot_s * f64::from(tokens)).max(first);
                    order += 1;
                    events.push(Reverse((us(at), order, i, tokens)));
                }
                flight.push(Some(Flight {
                    decision,
                    routed: t,
                    first,
                }));
            }
            Err(Error::Shed(shed)) => sheds.push((t, shed)),
            Err(e) => panic!("{e}"),
        }
    }
    sheds
}

/// The stall's reports come together, forty samples a worker within a few milliseconds:
/// the observed step weighs them by the time they span, not by their number, so the fleet,
/// which served every request within its targets, is refused nothing. (Decayed by samples,
/// the stall's reports outweighed the seconds before them, and the decode bound refused.)
#[test]
fn a_burst_of_slow_reports_refuses_nothing_on_a_fleet_that_keeps_up() {
    let router = BalancedRouter::new(4).expect("router");
    let sheds = run_with_stall(&router, 14.0);
    assert!(
        sheds.is_empty(),
        "{} needless refusals, the first: {:?}",
        sheds.len(),
        sheds.first()
    );
}
