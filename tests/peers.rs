//! The simulator's peer baselines (`examples/common/peers/`): each policy's choice on small
//! fleets whose scores are computed by hand from the rules its file cites.

#![allow(clippy::unwrap_used)]

use std::sync::Mutex;
use std::time::Duration;

use prefix_router::{
    CacheEvent, CacheSync, Candidate, Decide, EngineLoad, PdConfig, PdRouter, Policy, PolicyRouter,
    Role, RouteRequest, Router, Tier, TokenId, WorkerId,
};

#[path = "../examples/common/peers/mod.rs"]
mod rebuilt;

use rebuilt::{Aibrix, Dynamo, DynamoPd, IndependentPd, Llmd, LlmdPd};

/// The mirror's block size in these tests (the crate's default).
const BLOCK: usize = 16;

/// Wraps a peer policy: routes to a fixed candidate while `to` is set (to build a fleet's
/// in-flight counts), and keeps the candidates of the last choice.
struct Steer<P> {
    inner: P,
    to: Mutex<Option<usize>>,
    seen: Mutex<Vec<Candidate>>,
}

impl<P: Policy> Policy for Steer<P> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn reads_cache(&self) -> bool {
        self.inner.reads_cache()
    }

    fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        *self.seen.lock().unwrap() = candidates.to_vec();
        match *self.to.lock().unwrap() {
            Some(index) => index,
            None => self.inner.select(request, candidates),
        }
    }

    fn cost(&self, request: &RouteRequest<'_>, c: &Candidate) -> Option<prefix_router::Cost> {
        self.inner.cost(request, c)
    }
}

fn router<P: Policy>(workers: u32, inner: P) -> PolicyRouter<Steer<P>> {
    let steer = Steer {
        inner,
        to: Mutex::new(None),
        seen: Mutex::new(Vec::new()),
    };
    PolicyRouter::with_policy(workers, steer, Default::default()).unwrap()
}

fn w(i: u32) -> WorkerId {
    WorkerId::new(i)
}

/// A prompt of `blocks` whole blocks.
fn prompt(blocks: usize) -> Vec<TokenId> {
    (0..(blocks * BLOCK) as TokenId).collect()
}

/// Sends `count` requests (prompts unrelated to [`prompt`]'s) to worker `worker`.
fn occupy<P: Policy>(r: &PolicyRouter<Steer<P>>, worker: usize, count: usize) {
    *r.policy().to.lock().unwrap() = Some(worker);
    for k in 0..count {
        let filler: Vec<TokenId> = vec![1_000_000 + (worker * 1_000 + k) as TokenId; BLOCK];
        r.route(&RouteRequest::new(&filler)).unwrap();
    }
    *r.policy().to.lock().unwrap() = None;
}

/// The worker `r` chooses for `tokens`.
fn choice<R: Router>(r: &R, tokens: &[TokenId]) -> u32 {
    r.route(&RouteRequest::new(tokens)).unwrap().worker().get()
}

fn report(r: &impl Router, worker: u32, waiting: u64, kv_usage: f64) {
    let load = EngineLoad::new(waiting, 0, Duration::ZERO).with_kv_usage(kv_usage);
    r.report_load(w(worker), load).unwrap();
}

/// Equal within the precision of a reported KV usage (kept as an `f32`).
fn assert_near(got: f64, want: f64) {
    assert!((got - want).abs() < 1e-6, "got {got}, want {want}");
}

#[test]
fn llmd_picks_the_best_weighted_sum_of_its_three_scorers() {
    // Weights 2, 2, 3: worker 0 holds the whole prompt but has the longest queue
    // (0 + 2 * 0.5 + 3 * 1 = 4.0); worker 1 has none queued and little KV in use (2 * 1 +
    // 2 * 0.9 = 3.8); worker 2 is in between (2 * 0.5 + 2 * 0.5 = 2.0). Equal weights would
    // pick worker 1 (1.5, 1.9, 1.0).
    let r = router(3, Llmd::new(BLOCK));
    let p = prompt(4);
    r.replace_worker_cache(w(0), &[&p]).unwrap();
    report(&r, 0, 4, 0.5);
    report(&r, 1, 0, 0.1);
    report(&r, 2, 2, 0.5);
    assert_eq!(choice(&r, &p), 0);
    let seen = r.policy().seen.lock().unwrap().clone();
    let scores: Vec<f64> = seen.iter().map(|c| Llmd::score(c, (0, 4), 4)).collect();
    assert_near(scores[0], 4.0);
    assert_near(scores[1], 3.8);
    assert_near(scores[2], 2.0);
}

#[test]
fn llmd_queues_score_alike_when_equal_and_kv_usage_decides() {
    let r = router(2, Llmd::new(BLOCK));
    report(&r, 0, 3, 0.6);
    report(&r, 1, 3, 0.2);
    assert_eq!(choice(&r, &prompt(2)), 1);
    let seen = r.policy().seen.lock().unwrap().clone();
    // Equal queues score 1 each: 2 * 1 + 2 * (1 - usage).
    assert_near(Llmd::score(&seen[0], (3, 3), 2), 2.8);
    assert_near(Llmd::score(&seen[1], (3, 3), 2), 3.6);
}

#[test]
fn llmd_counts_at_most_256_prefix_blocks() {
    // Past 256 blocks llm-d's index does not look: holding 256 or all 300 scores alike, so
    // the idler worker 0 wins (it would lose if the prefix score were 256 / 300).
    let r = router(2, Llmd::new(BLOCK));
    let p = prompt(300);
    r.replace_worker_cache(w(0), &[&p[..256 * BLOCK]]).unwrap();
    r.replace_worker_cache(w(1), &[&p]).unwrap();
    report(&r, 0, 0, 0.3);
    report(&r, 1, 0, 0.4);
    assert_eq!(choice(&r, &p), 0);
    let seen = r.policy().seen.lock().unwrap().clone();
    assert_eq!(seen[1].matched_blocks(), 300);
    assert_near(Llmd::score(&seen[0], (0, 0), 256), 2.0 + 1.4 + 3.0);
    assert_near(Llmd::score(&seen[1], (0, 0), 256), 2.0 + 1.2 + 3.0);
}

/// Stores `p` for `worker` at `tier` through an engine event (hashes `base..`).
fn store(r: &impl CacheSync, worker: u32, p: &[TokenId], tier: Tier, base: u64) {
    let hashes = (base..base + (p.len() / BLOCK) as u64).collect();
    let event = CacheEvent::stored(None, hashes, p.to_vec()).with_tier(tier);
    r.apply_event(w(worker), 0, &event).unwrap();
}

#[test]
fn dynamo_credits_overlap_by_tier_against_prefill_and_decode_blocks() {
    // A 4-block prompt. Worker 0 holds it on the device but has 32 prefill tokens queued:
    // max((32 + 64) / 16 - 4, 0) + 4 = 6. Worker 1 holds it in host memory (credit 0.75 a
    // block): 4 - 3 + 4 = 5. Worker 2 on disk (0.25): 4 - 1 + 4 = 7. Worker 3 holds
    // nothing: 4 + 4 = 8.
    let r = router(4, Dynamo::new(BLOCK));
    let p = prompt(4);
    store(&r, 0, &p, Tier::Device, 100);
    store(&r, 1, &p, Tier::Host, 200);
    store(&r, 2, &p, Tier::Disk, 300);
    let queued = EngineLoad::new(1, 0, Duration::ZERO).with_prefill_tokens(32);
    r.report_load(w(0), queued).unwrap();
    let (decision, receipt) = r.route_with_receipt(&RouteRequest::new(&p)).unwrap();
    assert_eq!(decision.worker(), w(1));
    let totals: Vec<f64> = receipt
        .candidates
        .iter()
        .map(|line| line.cost.as_ref().unwrap().total())
        .collect();
    for (got, want) in totals.iter().zip([6.0, 5.0, 7.0, 8.0]) {
        assert_near(*got, want);
    }
    let host = &receipt.candidates[1].cost.as_ref().unwrap().terms;
    assert_eq!(host[0].name, "prefill_blocks");
    assert_near(host[0].value, 1.0);
}

#[test]
fn dynamo_charges_a_workers_active_prefill_and_context() {
    // Nothing cached: the first request's prefill (64 tokens) and context weigh on its
    // worker, so a second, unrelated one goes to the other.
    let r = router(2, Dynamo::new(BLOCK));
    let first = choice(&r, &prompt(4));
    let other: Vec<TokenId> = (500..564).collect();
    let (decision, receipt) = r.route_with_receipt(&RouteRequest::new(&other)).unwrap();
    assert_ne!(decision.worker().get(), first);
    let busy = receipt.candidates[first as usize].cost.as_ref().unwrap();
    let idle = receipt.candidates[1 - first as usize]
        .cost
        .as_ref()
        .unwrap();
    assert_near(busy.terms[0].value, (64.0 + 64.0) / 16.0);
    assert!(
        busy.terms[1].value > 4.0,
        "the busy worker's context counts"
    );
    assert_near(idle.terms[0].value, 4.0);
    assert_near(idle.terms[1].value, 4.0);
    let direct = Dynamo::new(BLOCK).cost_of(64, &r.policy().seen.lock().unwrap()[0]);
    assert_near(
        direct.total(),
        receipt.candidates[0].cost.as_ref().unwrap().total(),
    );
}

/// An AIBrix router over `counts.len()` workers with `counts` requests in flight, worker 0
/// holding all of a 4-block prompt and worker `half` its first half.
fn aibrix_fleet(counts: &[usize], half: usize) -> (PolicyRouter<Steer<Aibrix>>, Vec<TokenId>) {
    let r = router(counts.len() as u32, Aibrix::new(BLOCK));
    for (worker, &count) in counts.iter().enumerate() {
        occupy(&r, worker, count);
    }
    let p = prompt(4);
    r.replace_worker_cache(w(0), &[&p]).unwrap();
    r.replace_worker_cache(w(half as u32), &[&p[..2 * BLOCK]])
        .unwrap();
    (r, p)
}

#[test]
fn aibrix_takes_the_best_match_within_the_sample_standard_deviation() {
    // Counts 5, 3, 0: mean 2.67, sample deviation 2.52, bound 5.18: worker 0 (100 %) is
    // within it. A population deviation (2.05, bound 4.72) would skip it for worker 1 (50 %).
    let (r, p) = aibrix_fleet(&[5, 3, 0], 1);
    assert_eq!(choice(&r, &p), 0);
    let seen = r.policy().seen.lock().unwrap().clone();
    let aibrix = Aibrix::new(BLOCK);
    assert_eq!(aibrix.match_percent(p.len(), &seen[0]), 100);
    assert_eq!(aibrix.match_percent(p.len(), &seen[1]), 50);
    let (mean, sd) = Aibrix::mean_and_std_dev(&seen);
    assert_near(mean, 8.0 / 3.0);
    assert_near(sd, (57.0f64 / 9.0).sqrt());
}

#[test]
fn aibrix_falls_to_a_lesser_match_before_the_least_loaded() {
    // Counts 7, 3, 0: bound 3.33 + 3.51 = 6.85 excludes worker 0; worker 1's 50 % match is
    // next in order and within it, ahead of worker 2 (no match, fewest requests).
    let (r, p) = aibrix_fleet(&[7, 3, 0], 1);
    assert_eq!(choice(&r, &p), 1);
}

#[test]
fn aibrix_matches_only_the_least_loaded_past_an_imbalance_of_8() {
    // Counts 10, 10, 10, 1 (9 apart): only worker 3 may be matched; it holds half.
    let (r, p) = aibrix_fleet(&[10, 10, 10, 1], 3);
    assert_eq!(choice(&r, &p), 3);
    // Counts 9, 9, 9, 1 (8 apart) are not imbalanced: worker 0's full match is within the
    // bound (mean 7 + deviation 4).
    let (r, p) = aibrix_fleet(&[9, 9, 9, 1], 3);
    assert_eq!(choice(&r, &p), 0);
}

#[test]
fn aibrix_routes_to_the_least_request_worker_without_a_match() {
    let r = router(3, Aibrix::new(BLOCK));
    occupy(&r, 0, 2);
    occupy(&r, 1, 1);
    occupy(&r, 2, 3);
    assert_eq!(choice(&r, &prompt(4)), 1);
    // Imbalanced and no least-loaded worker matching: the least-request worker too.
    let (r, p) = aibrix_fleet(&[12, 12, 1], 1);
    assert_eq!(choice(&r, &p), 2);
}

/// A pair router over a prefill worker and two decode workers, deciding with `decider`, the
/// second decode worker holding `held` tokens of `prompt`.
fn pd_fleet<D: Decide>(decider: D, prompt: &[TokenId], held: usize) -> PdRouter<D> {
    let roles = [Role::Prefill, Role::Decode, Role::Decode];
    let router = PdRouter::with_decider(&roles, PdConfig::default(), decider).unwrap();
    if held > 0 {
        router
            .router()
            .replace_worker_cache(w(2), &[&prompt[..held]])
            .unwrap();
    }
    router
}

/// Whether `decider` splits `prompt` when the second decode worker holds `held` of it, and
/// the decode worker it chose.
fn splits<D: Decide>(decider: D, prompt: &[TokenId], held: usize) -> (bool, u32) {
    let pair = pd_fleet(decider, prompt, held)
        .route_pair(&RouteRequest::new(prompt))
        .unwrap();
    (pair.is_split(), pair.decode().worker().get())
}

#[test]
fn llmd_splits_from_sixteen_uncached_tokens_at_the_decode_worker() {
    let p = prompt(128);
    let llmd = || LlmdPd { block_size: BLOCK };
    // Decode first: the holder of the whole prompt, nothing uncached there: local.
    assert_eq!(splits(llmd(), &p, 128 * BLOCK), (false, 2));
    // One block (16 tokens) uncached at the holder: split.
    assert_eq!(splits(llmd(), &p, 127 * BLOCK), (true, 2));
    // Nothing held anywhere: split.
    assert!(splits(llmd(), &p, 0).0);
}

#[test]
fn dynamo_keeps_a_short_uncached_remainder_local() {
    let dynamo = || DynamoPd { block_size: BLOCK };
    // 5,008 tokens, 4,096 held: 912 uncached (under 2,048 and 18 % of the prompt): local.
    let p = prompt(313);
    assert_eq!(splits(dynamo(), &p, 256 * BLOCK), (false, 2));
    // 1,024 tokens, none held: under 2,048 but all of the prompt: split.
    let short = prompt(64);
    assert!(splits(dynamo(), &short, 0).0);
    // 40,000 tokens, 4,096 held: 35,904 uncached: split.
    let long = prompt(2_500);
    assert!(splits(dynamo(), &long, 256 * BLOCK).0);
}

#[test]
fn independent_picks_always_split() {
    let p = prompt(64);
    for held in [0, 64 * BLOCK] {
        assert!(splits(IndependentPd::new(), &p, held).0, "held {held}");
    }
    assert_eq!(IndependentPd::new().name(), "independent");
}
