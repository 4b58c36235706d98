//! The peers' admission rules, each the [`Policy::admit`](prefix_router::Policy::admit) of
//! its project's policy: what `--policy llmd|dynamo --admission on` refuses. The facts, with
//! the files and commits they come from, are in `admission.md` beside this file.
//!
//! - **Dynamo** (busy thresholds, `lib/llm/src/discovery/worker_monitor.rs`): a worker is
//!   busy when its KV usage is over the decode-blocks threshold or its active prefill tokens
//!   over the prefill-tokens threshold; a request is refused, whatever its priority, when
//!   every worker is busy. Every threshold is off by default; the values are the ones
//!   Dynamo's request-rejection guide starts its frontend with: 0.85 of KV blocks and 10,000
//!   prefill tokens. Left out: the decode latch's hysteresis (it clears only when both the
//!   router's and the engine's KV figures are back under the threshold; here it is the
//!   engine's last report alone), and the push router's removal of busy workers from the
//!   choice (the KV router's cost chooses among all of them here).
//! - **llm-d** (the saturation detector and the legacy admission controller,
//!   `saturationdetector/utilization/detector.go`, `sheddable.go`): the pool's saturation is
//!   the mean over workers of `max(waiting / 5, kv_usage / 0.8)`, a worker whose metrics are
//!   stale counting 1; a request is refused when it is sheddable (priority below 0) and the
//!   saturation is at least 1. Standard and critical requests are never refused. Left out:
//!   the flow-control queue (behind a feature gate that is off by default), which holds
//!   requests in priority bands instead of refusing them.

use prefix_router::{Admit, Candidate, Limit, Priority};

/// Dynamo's documented KV-usage threshold: a worker over it is busy.
pub(crate) const DYNAMO_KV_THRESHOLD: f64 = 0.85;
/// Dynamo's documented active-prefill-tokens threshold: a worker over it is busy.
pub(crate) const DYNAMO_PREFILL_THRESHOLD: u64 = 10_000;
/// llm-d's queue-depth threshold (waiting requests at which a worker counts saturated).
pub(crate) const LLMD_QUEUE_THRESHOLD: f64 = 5.0;
/// llm-d's KV-usage threshold.
pub(crate) const LLMD_KV_THRESHOLD: f64 = 0.8;

/// Dynamo's verdict: refused when every worker is busy, bound by the limit most of them
/// are busy on.
pub(crate) fn dynamo_admit(candidates: &[Candidate]) -> Admit {
    let kv_busy = |c: &Candidate| c.kv_usage() > DYNAMO_KV_THRESHOLD;
    let prefill_busy = |c: &Candidate| c.prefill_tokens() > DYNAMO_PREFILL_THRESHOLD;
    if candidates.iter().any(|c| !kv_busy(c) && !prefill_busy(c)) {
        return Admit::All;
    }
    let on_kv = candidates.iter().filter(|c| kv_busy(c)).count();
    if 2 * on_kv >= candidates.len() {
        Admit::Refuse(Limit::Kv)
    } else {
        Admit::Refuse(Limit::Queue)
    }
}

/// One worker's saturation as llm-d's detector scores it, and whether its queue, its KV or
/// stale metrics set it.
pub(crate) fn llmd_saturation(c: &Candidate) -> (f64, Limit) {
    if c.saturated() {
        return (1.0, Limit::Stale);
    }
    let queue = c.waiting() as f64 / LLMD_QUEUE_THRESHOLD;
    let kv = c.kv_usage() / LLMD_KV_THRESHOLD;
    if queue >= kv {
        (queue, Limit::Queue)
    } else {
        (kv, Limit::Kv)
    }
}

/// llm-d's verdict: a sheddable request is refused when the pool's mean saturation is at
/// least 1, bound by the limit that set most workers' scores; anything else is admitted.
pub(crate) fn llmd_admit(priority: Priority, candidates: &[Candidate]) -> Admit {
    if priority != Priority::Sheddable || candidates.is_empty() {
        return Admit::All;
    }
    let scores = candidates.iter().map(llmd_saturation);
    let mean = scores.clone().map(|(s, _)| s).sum::<f64>() / candidates.len() as f64;
    if mean < 1.0 {
        return Admit::All;
    }
    let count = |limit| scores.clone().filter(|(_, l)| *l == limit).count();
    let limit = [Limit::Queue, Limit::Kv, Limit::Stale]
        .into_iter()
        .max_by_key(|l| count(*l))
        .unwrap_or(Limit::Queue);
    Admit::Refuse(limit)
}
