//! What engines really hold: storage tiers, KV-cache groups, data-parallel ranks, namespaces,
//! and scoring by reload time.

#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};

use common::{prompt_strategy, tokens};
use prefix_router::*;
use proptest::prelude::*;

use crate::common;

const W0: WorkerId = WorkerId::new(0);
const W1: WorkerId = WorkerId::new(1);

fn by_tier(router: &BalancedRouter, worker: WorkerId, prompt: &[u32]) -> [usize; 4] {
    router
        .index()
        .cached_tokens_by_tier(worker, &RouteRequest::new(prompt))
}

/// SGLang's router bug (sglang#39108): a GPU eviction of blocks the host tier still holds
/// made the prefix unroutable. Demoted blocks stay routable at the host tier, and storing
/// them on the device again promotes them.
#[test]
fn demotion_keeps_the_prefix_at_the_host_tier_and_promotion_brings_it_back() {
    let router = BalancedRouter::new(2).unwrap();
    let t = tokens(1, 4);
    router
        .apply_event(
            W0,
            0,
            &CacheEvent::stored(None, vec![1, 2, 3, 4], t.clone()),
        )
        .unwrap();
    // vLLM 0.33 copies blocks to the CPU as they are computed: a placeholder per chunk
    // (of one block here).
    let o = router
        .apply_event(
            W0,
            0,
            &CacheEvent::placeholder(vec![1, 2, 3, 4], Tier::Host),
        )
        .unwrap();
    assert_eq!(o.unknown_blocks, 0);
    assert_eq!(
        by_tier(&router, W0, &t),
        [64, 0, 0, 0],
        "device is the best tier"
    );
    // The GPU evicts the whole chain, last block first.
    for b in [4, 3, 2, 1] {
        router
            .apply_event(W0, 1, &CacheEvent::removed(vec![b]))
            .unwrap();
    }
    assert_eq!(
        by_tier(&router, W0, &t),
        [0, 64, 0, 0],
        "held at the host tier"
    );
    let (d, receipt) = router.route_with_receipt(&RouteRequest::new(&t)).unwrap();
    assert_eq!(d.worker(), W0, "still routed where it is cached: {receipt}");
    assert_eq!(d.cached_tokens_at(Tier::Host), 64);
    router.complete(&d);
    // The engine loads the chain back to the GPU and reports it stored there again.
    router
        .apply_event(
            W0,
            2,
            &CacheEvent::stored(None, vec![1, 2, 3, 4], t.clone()),
        )
        .unwrap();
    let [device, host, ..] = by_tier(&router, W0, &t);
    assert_eq!(
        (device, host),
        (64, 0),
        "promoted: the device is the best tier again"
    );
    // The host copy goes too: a block removed from its last tier is gone.
    router
        .apply_event(W0, 3, &CacheEvent::removed(vec![1]))
        .unwrap();
    router
        .apply_event(W0, 3, &CacheEvent::removed(vec![1]).with_tier(Tier::Host))
        .unwrap();
    assert_eq!(router.index().cached_tokens(W0, &[], &t), 0);
    router.index().with_tree(|t| t.validate()).unwrap();
}

/// A prefix-cache reset clears the device tier only; host copies stay.
#[test]
fn a_reset_clears_the_device_tier_only() {
    let router = BalancedRouter::new(1).unwrap();
    let (a, b) = (tokens(1, 2), tokens(2, 2));
    router
        .apply_event(W0, 0, &CacheEvent::stored(None, vec![1, 2], a.clone()))
        .unwrap();
    router
        .apply_event(W0, 0, &CacheEvent::stored(None, vec![3, 4], b.clone()))
        .unwrap();
    router
        .apply_event(W0, 0, &CacheEvent::placeholder(vec![1, 2], Tier::Host))
        .unwrap();
    router.apply_event(W0, 1, &CacheEvent::Cleared).unwrap();
    assert_eq!(by_tier(&router, W0, &a), [0, 32, 0, 0]);
    assert_eq!(router.index().cached_tokens(W0, &[], &b), 0);
    // Blocks held nowhere are forgotten: their removal names an unknown block.
    let o = router
        .apply_event(W0, 2, &CacheEvent::removed(vec![4]))
        .unwrap();
    assert_eq!(o.unknown_removed_blocks, 1);
    router.index().with_tree(|t| t.validate()).unwrap();
}

/// Hybrid models (AMD-AGI/Infera#98): groups report equal hashes, and a sliding-window
/// group evicting blocks behind its window must not evict the attention group's.
#[test]
fn groups_with_equal_hashes_do_not_poison_each_other() {
    let router = BalancedRouter::new(1).unwrap();
    let t = tokens(3, 4);
    let window = GroupKind::SlidingWindow { tokens: 32 };
    let blocks = vec![11, 12, 13, 14];
    router
        .apply_event(W0, 0, &CacheEvent::stored(None, blocks.clone(), t.clone()))
        .unwrap();
    let sliding = CacheEvent::stored(None, blocks, t.clone())
        .with_group(1)
        .with_group_kind(window);
    router.apply_event(W0, 0, &sliding).unwrap();
    // The sliding-window group frees the blocks behind its window.
    let o = router
        .apply_event(W0, 1, &CacheEvent::removed(vec![11, 12]).with_group(1))
        .unwrap();
    assert_eq!(o.removed_blocks, 2);
    assert_eq!(
        router.index().cached_tokens(W0, &[], &t),
        64,
        "the window's blocks are all a hit needs from that group"
    );
    router.index().with_tree(|t| t.validate()).unwrap();
}

/// A hybrid hit stops where a group it needs stops.
#[test]
fn a_hybrid_hit_stops_where_a_needed_group_stops() {
    let router = BalancedRouter::new(1).unwrap();
    let t = tokens(4, 6);
    let blocks: Vec<u64> = (21..27).collect();
    router
        .apply_event(W0, 0, &CacheEvent::stored(None, blocks.clone(), t.clone()))
        .unwrap();
    let sliding = CacheEvent::stored(None, blocks.clone(), t.clone())
        .with_group(1)
        .with_group_kind(GroupKind::SlidingWindow { tokens: 32 });
    router.apply_event(W0, 0, &sliding).unwrap();
    // Blocks 0 and 4, 5 (engine 21, 25, 26) leave the window group: the longest end whose
    // two preceding blocks it holds is after block 3.
    router
        .apply_event(W0, 1, &CacheEvent::removed(vec![21, 25, 26]).with_group(1))
        .unwrap();
    assert_eq!(router.index().cached_tokens(W0, &[], &t), 4 * 16);
    // A Mamba group needs the state at the hit's end: it holds only block 2.
    let mamba = CacheEvent::stored(None, blocks[..3].to_vec(), t[..48].to_vec())
        .with_group(2)
        .with_group_kind(GroupKind::Mamba);
    router.apply_event(W0, 1, &mamba).unwrap();
    router
        .apply_event(W0, 2, &CacheEvent::removed(vec![21, 22]).with_group(2))
        .unwrap();
    assert_eq!(router.index().cached_tokens(W0, &[], &t), 3 * 16);
    // A group beyond what the router tracks is skipped and counted, never an error.
    let far = CacheEvent::stored(None, vec![1], t[..16].to_vec()).with_group(99);
    assert_eq!(router.apply_event(W0, 3, &far).unwrap().skipped_blocks, 1);
}

/// DP attention (llm-d-router#2306): each rank of an endpoint keeps its own mirror, and a
/// removal on one rank leaves the other's.
#[cfg(feature = "vllm")]
#[test]
fn two_ranks_of_one_endpoint_keep_separate_mirrors() {
    use prefix_router::sync::vllm::{EngineEvent, EventBatch, apply_batch};
    let layout = RankLayout::new(2).unwrap();
    let router = BalancedRouter::new(layout.targets(2))
        .unwrap()
        .with_rank_layout(layout);
    let t = tokens(5, 2);
    let stored = |rank| batch(rank, vec![stored_event(&[31, 32], &t)]);
    fn stored_event(hashes: &[u64], tokens: &[u32]) -> EngineEvent {
        prefix_router::sync::vllm::decode_batch(&encode_stored(hashes, tokens))
            .unwrap()
            .events
            .remove(0)
    }
    fn batch(rank: u32, events: Vec<EngineEvent>) -> EventBatch {
        let mut b = prefix_router::sync::vllm::decode_batch(&encode_empty()).unwrap();
        b.events = events;
        b.data_parallel_rank = Some(rank);
        b
    }
    apply_batch(&router, &layout, 1, 0, &stored(0)).unwrap();
    apply_batch(&router, &layout, 1, 0, &stored(1)).unwrap();
    let (r0, r1) = (layout.target(1, 0).unwrap(), layout.target(1, 1).unwrap());
    let mut removal = batch(1, Vec::new());
    removal.events = prefix_router::sync::vllm::decode_batch(&encode_removed(&[32]))
        .unwrap()
        .events;
    apply_batch(&router, &layout, 1, 1, &removal).unwrap();
    assert_eq!(router.index().cached_tokens(r0, &[], &t), 32);
    assert_eq!(router.index().cached_tokens(r1, &[], &t), 16);
    // The decision names the rank for the X-data-parallel-rank header.
    let d = router.route(&RouteRequest::new(&t)).unwrap();
    assert_eq!((d.worker(), d.rank()), (r0, 0));
    router.complete(&d);
    // A rank beyond the layout is an error, not a panic.
    assert!(matches!(
        apply_batch(&router, &layout, 1, 2, &batch(2, Vec::new())),
        Err(Error::InvalidRank { rank: 2, ranks: 2 })
    ));
}

/// msgpack of `[0.0, [["BlockStored", hashes, nil, tokens, 16]]]`.
#[cfg(feature = "vllm")]
fn encode_stored(hashes: &[u64], tokens: &[u32]) -> Vec<u8> {
    let mut out = vec![0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x95];
    push_str(&mut out, "BlockStored");
    push_array(&mut out, hashes.iter().map(|&h| h as u128));
    out.push(0xc0);
    push_array(&mut out, tokens.iter().map(|&t| u128::from(t)));
    out.push(16);
    out
}

/// msgpack of `[0.0, [["BlockRemoved", hashes]]]`.
#[cfg(feature = "vllm")]
fn encode_removed(hashes: &[u64]) -> Vec<u8> {
    let mut out = vec![0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x92];
    push_str(&mut out, "BlockRemoved");
    push_array(&mut out, hashes.iter().map(|&h| h as u128));
    out
}

/// msgpack of `[0.0, []]`.
#[cfg(feature = "vllm")]
fn encode_empty() -> Vec<u8> {
    vec![0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90]
}

#[cfg(feature = "vllm")]
fn push_str(out: &mut Vec<u8>, s: &str) {
    out.push(0xa0 | s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

#[cfg(feature = "vllm")]
fn push_array(out: &mut Vec<u8>, items: impl ExactSizeIterator<Item = u128>) {
    out.push(0xdc);
    out.extend_from_slice(&(items.len() as u16).to_be_bytes());
    for v in items {
        out.push(0xcf);
        out.extend_from_slice(&(v as u64).to_be_bytes());
    }
}

/// A longer host-tier match beats a shorter device match exactly when its predicted time to
/// first token (recomputation plus reload) is lower; the receipt shows the terms.
#[test]
fn reload_time_decides_between_a_long_host_hit_and_a_short_device_hit() {
    let prompt = tokens(6, 100);
    for host_bytes_per_s in [50e9, 10e9] {
        let reload = ReloadConfig::default().with_host_bytes_per_s(host_bytes_per_s);
        let config = BalancedConfig::default()
            .with_miss_weight(1.0)
            .with_reload(reload);
        let router = BalancedRouter::with_config(2, config).unwrap();
        let engine: Vec<u64> = (1..=100).collect();
        // W0 holds the first 50 blocks on the device; W1 all 100 at the host tier only.
        let half = CacheEvent::stored(None, engine[..50].to_vec(), prompt[..800].to_vec());
        router.apply_event(W0, 0, &half).unwrap();
        let all = CacheEvent::stored(None, engine.clone(), prompt.clone()).with_tier(Tier::Host);
        router.apply_event(W1, 0, &all).unwrap();
        // Both take one step (its fixed part as well), and decode alike.
        let rate = config.load.prefill_tokens_per_s;
        let step = config.load.step.step_base_s;
        let ttft_device = step + 800.0 / rate;
        let ttft_host = step + reload.seconds(Tier::Host, 1600);
        let (d, receipt) = router
            .route_with_receipt(&RouteRequest::new(&prompt))
            .unwrap();
        let expected = if ttft_host < ttft_device { W1 } else { W0 };
        assert_eq!(d.worker(), expected, "{receipt}");
        let costs: HashMap<WorkerId, f64> = receipt
            .candidates
            .iter()
            .map(|l| (l.worker, l.cost.as_ref().unwrap().total()))
            .collect();
        let term = |w: WorkerId, name: &str| {
            let line = receipt.candidates.iter().find(|l| l.worker == w).unwrap();
            let cost = line.cost.as_ref().unwrap();
            cost.terms.iter().find(|t| t.name == name).unwrap().value
        };
        assert!((costs[&W0] - costs[&W1] - (ttft_device - ttft_host)).abs() < 1e-9);
        assert!((term(W0, "ttft_s") - ttft_device).abs() < 1e-9, "{receipt}");
        assert!((term(W1, "ttft_s") + term(W1, "reload_s") - ttft_host).abs() < 1e-9);
        assert_eq!(term(W0, "decode_s"), term(W1, "decode_s"));
        assert_eq!(receipt.chosen_line().unwrap().worker, expected);
        router.complete(&d);
    }
}

/// A LoRA adapter's blocks, reported with its name, match only requests routed under the
/// same namespace; a block's extra key (an image) keeps equal placeholder tokens apart.
#[test]
fn namespaces_and_extra_keys_keep_equal_tokens_apart() {
    let router = BalancedRouter::new(2).unwrap();
    let t = tokens(7, 3);
    let lora = namespace_salt(Some("finance"), None);
    let event = CacheEvent::stored(None, vec![41, 42, 43], t.clone()).with_salt(lora.clone());
    router.apply_event(W1, 0, &event).unwrap();
    assert_eq!(router.index().cached_tokens(W1, &lora, &t), 48);
    assert_eq!(
        router.index().cached_tokens(W1, &[], &t),
        0,
        "not the base model's"
    );
    let image = [BlockKey::from_parts(1, &[b"image-a", b"0"])];
    let keyed = CacheEvent::stored(None, vec![51, 52, 53], t.clone()).with_keys(image.to_vec());
    router.apply_event(W0, 0, &keyed).unwrap();
    let same = RouteRequest::new(&t).with_keys(&image);
    assert_eq!(router.index().cached_tokens_by_tier(W0, &same)[0], 48);
    let other = [BlockKey::from_parts(1, &[b"image-b", b"0"])];
    let differs = RouteRequest::new(&t).with_keys(&other);
    assert_eq!(
        router.index().cached_tokens_by_tier(W0, &differs)[0],
        16,
        "the block before the image is shared, the rest is not"
    );
}

/// A lower tier's removal of a block the worker holds on the device alone leaves it held,
/// and the device's later removal drops it: whether or not the mirror has seen a lower tier
/// yet (found by the simulator's host tier, chunks of 2 blocks).
#[test]
fn a_lower_tier_removal_of_a_device_block_keeps_it_until_the_device_drops_it() {
    for seen_host_before in [false, true] {
        let index = CacheIndex::new(IndexConfig::default().with_host_chunk_blocks(2)).unwrap();
        let t = tokens(3, 4);
        let mut seq = 0;
        let mut apply = |e: CacheEvent| {
            index.apply_event(W0, seq, &e).unwrap();
            seq += 1;
        };
        if seen_host_before {
            let other = tokens(4, 2);
            apply(CacheEvent::stored(None, vec![90, 91], other));
            apply(CacheEvent::placeholder(vec![91], Tier::Host));
        }
        apply(CacheEvent::stored(None, vec![1, 2, 3, 4], t.clone()));
        apply(CacheEvent::removed(vec![4]).with_tier(Tier::Host));
        assert_eq!(index.cached_tokens(W0, &[], &t), 64, "{seen_host_before}");
        apply(CacheEvent::removed(vec![4]));
        assert_eq!(index.cached_tokens(W0, &[], &t), 48, "{seen_host_before}");
    }
}

/// Host chunks of 2 blocks: a hit below the device tier counts whole chunks only, and two
/// chunks sharing their first block are dropped one at a time.
#[test]
fn host_chunks_are_hit_whole_and_dropped_one_at_a_time() {
    let index = CacheIndex::new(IndexConfig::default().with_host_chunk_blocks(2)).unwrap();
    let a = tokens(5, 1);
    let ab: Vec<u32> = a.iter().copied().chain(tokens(6, 1)).collect();
    let ac: Vec<u32> = a.iter().copied().chain(tokens(7, 1)).collect();
    let mut seq = 0;
    let mut apply = |e: CacheEvent| {
        index.apply_event(W0, seq, &e).unwrap();
        seq += 1;
    };
    apply(CacheEvent::stored(None, vec![1, 2], ab.clone()));
    apply(CacheEvent::stored(Some(1), vec![3], tokens(7, 1)));
    apply(CacheEvent::placeholder(vec![2, 3], Tier::Host));
    apply(CacheEvent::removed(vec![1]));
    assert_eq!(
        index.cached_tokens(W0, &[], &ab),
        32,
        "chunk (a, b) from the host"
    );
    assert_eq!(
        index.cached_tokens(W0, &[], &ac),
        32,
        "chunk (a, c) from the host"
    );
    let ad: Vec<u32> = a.iter().copied().chain(tokens(8, 1)).collect();
    assert_eq!(
        index.cached_tokens(W0, &[], &ad),
        0,
        "a alone is half a chunk"
    );
    apply(CacheEvent::removed(vec![2]).with_tier(Tier::Host));
    assert_eq!(index.cached_tokens(W0, &[], &ab), 0);
    assert_eq!(
        index.cached_tokens(W0, &[], &ac),
        32,
        "the other chunk stays"
    );
}

/// A worker's cached-token reports are counted against what the mirror predicted, so that
/// a mismatch (block size, LoRA, group, hash) shows instead of staying silent.
#[test]
fn reports_are_counted_against_predictions() {
    let router = BalancedRouter::new(1).unwrap();
    let t = tokens(8, 4);
    let d = router.route(&RouteRequest::new(&t)).unwrap();
    router.complete(&d);
    router.report_cached(W0, &t, 64).unwrap();
    router.report_cached(W0, &t, 16).unwrap();
    let load = router.load(W0).unwrap();
    assert_eq!(load.reports, 2);
    assert_eq!(load.reported_cached_tokens, 80);
    // Each report finds the whole prompt predicted: the worker computed it.
    assert_eq!(load.predicted_for_reports_tokens, 128);
    assert_eq!(load.mispredicted_reports, 1);
}

/// A worker of the tiered model: a device cache and a host cache, each an LRU over blocks
/// that evicts leaves first, the host filled as vLLM 0.33's CPU offloading fills it: every
/// block of a request copied once it is on the device (as it is computed, or after a hit
/// when its copy was gone), a chunk of one block named by that block, and every copy a
/// request uses touched.
struct TieredWorker {
    device: usize,
    host: usize,
    /// engine hash -> parent; which tiers hold it with last use there.
    parents: HashMap<u64, Option<u64>>,
    on_device: HashMap<u64, u64>,
    on_host: HashMap<u64, u64>,
    clock: u64,
}

fn engine_hashes(prompt: &[u32]) -> Vec<u64> {
    let mut out = Vec::new();
    let mut h = 0x1234_5678u64;
    for block in prompt.chunks_exact(16) {
        for &t in block {
            h = (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01B3);
        }
        out.push(h);
    }
    out
}

impl TieredWorker {
    /// Leading blocks held, and how many of them on the device (the best tier of each).
    fn held(&self, prompt: &[u32]) -> (usize, usize) {
        let hashes = engine_hashes(prompt);
        let held = hashes
            .iter()
            .take_while(|h| self.on_device.contains_key(h) || self.on_host.contains_key(h))
            .count();
        let device = hashes[..held]
            .iter()
            .filter(|h| self.on_device.contains_key(h))
            .count();
        (held, device)
    }

    /// Evicts least recently used leaves of `tier` beyond `capacity`.
    fn evict(
        tier: &mut HashMap<u64, u64>,
        parents: &HashMap<u64, Option<u64>>,
        capacity: usize,
    ) -> Vec<u64> {
        let mut removed = Vec::new();
        while tier.len() > capacity {
            let inner: HashSet<u64> = tier.keys().filter_map(|h| parents[h]).collect();
            let victim = tier
                .iter()
                .filter(|(h, _)| !inner.contains(h))
                .min_by_key(|(h, used)| (**used, **h))
                .map(|(h, _)| *h)
                .unwrap();
            tier.remove(&victim);
            removed.push(victim);
        }
        removed
    }

    /// Serves `prompt`: a device hit, then host blocks loaded back and the rest computed
    /// (both stored on the device again, the computed ones also copied to the host).
    fn serve(&mut self, prompt: &[u32]) -> Vec<CacheEvent> {
        self.clock += 1;
        let hashes = engine_hashes(prompt);
        let on_device = hashes
            .iter()
            .take_while(|h| self.on_device.contains_key(h))
            .count();
        let mut events = Vec::new();
        let mut copied = Vec::new();
        for (i, &h) in hashes.iter().enumerate() {
            self.parents.insert(h, i.checked_sub(1).map(|p| hashes[p]));
            self.on_device.insert(h, self.clock);
            if self.on_host.insert(h, self.clock).is_none() {
                copied.push(h);
            }
        }
        if on_device < hashes.len() {
            let parent = on_device.checked_sub(1).map(|i| hashes[i]);
            let tokens = prompt[on_device * 16..hashes.len() * 16].to_vec();
            events.push(CacheEvent::stored(
                parent,
                hashes[on_device..].to_vec(),
                tokens,
            ));
        }
        if !copied.is_empty() {
            events.push(CacheEvent::placeholder(copied, Tier::Host));
        }
        let gone = Self::evict(&mut self.on_device, &self.parents, self.device);
        if !gone.is_empty() {
            events.push(CacheEvent::removed(gone));
        }
        let gone = Self::evict(&mut self.on_host, &self.parents, self.host);
        if !gone.is_empty() {
            events.push(CacheEvent::removed(gone).with_tier(Tier::Host));
        }
        events
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    /// A router fed a tiered fleet's events predicts, for every worker and prompt, how many
    /// leading blocks the worker holds and how many of them on the device: up to three
    /// workers, each with a device and a host LRU of its own capacity.
    #[test]
    fn event_fed_mirror_predicts_every_tier(
        requests in prop::collection::vec((prompt_strategy(), 0usize..3), 1..30),
        capacities in prop::collection::vec((1usize..12, 1usize..24), 1..4),
    ) {
        let n = capacities.len();
        let router = BalancedRouter::new(n as u32).unwrap();
        let mut workers: Vec<TieredWorker> = capacities
            .iter()
            .map(|&(device, host)| TieredWorker {
                device,
                host,
                parents: HashMap::new(),
                on_device: HashMap::new(),
                on_host: HashMap::new(),
                clock: 0,
            })
            .collect();
        for (seq, (prompt, w)) in requests.iter().enumerate() {
            let w = w % n;
            for event in workers[w].serve(prompt) {
                let o = router.apply_event(WorkerId::new(w as u32), seq as u64, &event).unwrap();
                prop_assert_eq!(o.unknown_parent_blocks + o.unknown_blocks, 0);
            }
            router.index().with_tree(|t| t.validate()).map_err(TestCaseError::fail)?;
            for (later, _) in &requests {
                for (v, model) in workers.iter().enumerate() {
                    let (held, device) = model.held(later);
                    let got = by_tier(&router, WorkerId::new(v as u32), later);
                    prop_assert_eq!(got[0] + got[1], held * 16, "worker {} holds", v);
                    prop_assert_eq!(got[0], device * 16, "worker {} on the device", v);
                }
            }
        }
    }
}

/// A case `event_fed_mirror_predicts_every_tier` once failed on (shrunk): a one-block host
/// tier evicting copies of blocks a larger device keeps, checked after each request.
#[test]
fn a_one_block_host_tier_under_a_larger_device() {
    let block = |b: u32| -> Vec<u32> { (0..16).map(|i| b * 100 + i).collect() };
    let prompt = |blocks: &[u32]| -> Vec<u32> { blocks.iter().flat_map(|&b| block(b)).collect() };
    let prompts = [prompt(&[0, 0, 0, 0, 0, 0]), prompt(&[1, 0, 0, 0])];
    let router = BalancedRouter::new(1).unwrap();
    let mut worker = TieredWorker {
        device: 7,
        host: 1,
        parents: HashMap::new(),
        on_device: HashMap::new(),
        on_host: HashMap::new(),
        clock: 0,
    };
    for (seq, p) in prompts.iter().enumerate() {
        for event in worker.serve(p) {
            router.apply_event(W0, seq as u64, &event).unwrap();
        }
        for later in &prompts {
            let (held, device) = worker.held(later);
            let got = by_tier(&router, W0, later);
            assert_eq!((got[0] + got[1], got[0]), (held * 16, device * 16));
        }
    }
}

/// vLLM's connector looks up CPU chunks from the one holding the device hit's end, and
/// loads them only when they add a whole chunk; a chunk stays loadable when an earlier one
/// is dropped, as long as the device covers it.
#[test]
fn host_chunks_continue_the_device_hit_as_vllms_connector_loads_them() {
    let index = CacheIndex::new(IndexConfig::default().with_host_chunk_blocks(2)).unwrap();
    let prompt = tokens(9, 6); // blocks 1..=6, chunks (1 2) (3 4) (5 6)
    let mut seq = 0;
    let mut apply = |e: CacheEvent| {
        index.apply_event(W0, seq, &e).unwrap();
        seq += 1;
    };
    apply(CacheEvent::stored(None, (1..=6).collect(), prompt.clone()));
    apply(CacheEvent::placeholder(vec![2, 4, 6], Tier::Host));
    apply(CacheEvent::removed(vec![6, 5, 4]));
    // Device 3 blocks; chunk (3 4) holds block 3, then (5 6): 6 blocks.
    assert_eq!(index.cached_tokens(W0, &[], &prompt), 96);
    apply(CacheEvent::removed(vec![6]).with_tier(Tier::Host));
    // Chunk (3 4) would add one block only: less than a chunk, not loaded.
    assert_eq!(index.cached_tokens(W0, &[], &prompt), 48);
    apply(CacheEvent::placeholder(vec![6], Tier::Host));
    apply(CacheEvent::removed(vec![2]).with_tier(Tier::Host));
    // Chunk (1 2) gone from the host, but the device covers it.
    assert_eq!(index.cached_tokens(W0, &[], &prompt), 96);
    apply(CacheEvent::removed(vec![3, 2, 1]));
    assert_eq!(
        index.cached_tokens(W0, &[], &prompt),
        0,
        "the lookup starts at chunk (1 2), gone"
    );
    // The prompt's last token is always computed: a whole-block prompt reuses one less.
    apply(CacheEvent::stored(
        None,
        vec![1, 2, 3],
        prompt[..48].to_vec(),
    ));
    assert_eq!(index.reusable_tokens(W0, &[], &prompt[..48]), 32);
    assert_eq!(index.reusable_tokens(W0, &[], &prompt), 96);
}

/// With self-describing events a chunk carries its blocks; two chunks that share a prefix
/// not aligned to chunks both announce its blocks, and each one's removal names them.
#[test]
fn chunks_sharing_blocks_are_counted_per_announcement() {
    let index = CacheIndex::new(IndexConfig::default().with_host_chunk_blocks(2)).unwrap();
    let (a, b, c) = (tokens(1, 1), tokens(2, 1), tokens(3, 1));
    let ab: Vec<u32> = [a.clone(), b.clone()].concat();
    let ac: Vec<u32> = [a.clone(), c.clone()].concat();
    let host = |blocks: Vec<u64>, t: &[u32]| {
        CacheEvent::stored(None, blocks, t.to_vec()).with_tier(Tier::Host)
    };
    index.apply_event(W0, 0, &host(vec![1, 2], &ab)).unwrap();
    index.apply_event(W0, 0, &host(vec![1, 3], &ac)).unwrap();
    assert_eq!(index.cached_tokens(W0, &[], &ac), 32);
    let o = index
        .apply_event(
            W0,
            1,
            &CacheEvent::removed(vec![1, 2]).with_tier(Tier::Host),
        )
        .unwrap();
    assert_eq!(o.unknown_removed_blocks, 0);
    assert_eq!(index.cached_tokens(W0, &[], &ab), 0);
    assert_eq!(
        index.cached_tokens(W0, &[], &ac),
        32,
        "block 1 is still announced by (1 3)"
    );
    index
        .apply_event(
            W0,
            2,
            &CacheEvent::removed(vec![1, 3]).with_tier(Tier::Host),
        )
        .unwrap();
    assert_eq!(index.cached_tokens(W0, &[], &ac), 0);
    // Block 1 is removed once more than announced, as vLLM does for a chunk it stored as
    // a placeholder (its last block only) and removes block by block: a block dropped
    // lately, nothing changes; a block never seen is unknown.
    let o = index
        .apply_event(
            W0,
            3,
            &CacheEvent::removed(vec![1, 99]).with_tier(Tier::Host),
        )
        .unwrap();
    assert_eq!((o.removed_blocks, o.unknown_removed_blocks), (1, 1));
    assert_eq!(index.cached_tokens(W0, &[], &ac), 0);
}

/// vLLM reports a CPU copy when its transfer completes, a few steps after it began: the GPU
/// may have dropped the block (a placeholder) or the block before a chunk (a self-describing
/// store) by then. Both are still followed.
#[test]
fn copies_reported_after_the_device_dropped_their_blocks_are_followed() {
    let index = CacheIndex::new(IndexConfig::default().with_host_chunk_blocks(1)).unwrap();
    let prompt = tokens(4, 3);
    // The worker's host tier is known by a first copy.
    index
        .apply_event(W0, 0, &CacheEvent::stored(None, vec![9], tokens(5, 1)))
        .unwrap();
    index
        .apply_event(W0, 0, &CacheEvent::placeholder(vec![9], Tier::Host))
        .unwrap();
    index
        .apply_event(
            W0,
            1,
            &CacheEvent::stored(None, vec![1, 2, 3], prompt.clone()),
        )
        .unwrap();
    index
        .apply_event(W0, 2, &CacheEvent::removed(vec![3, 2, 1]))
        .unwrap();
    let o = index
        .apply_event(W0, 3, &CacheEvent::placeholder(vec![1], Tier::Host))
        .unwrap();
    assert_eq!(o.unknown_blocks, 0);
    // One store per chunk, as vLLM publishes them.
    for (parent, block, tokens) in [(1, 2, &prompt[16..32]), (2, 3, &prompt[32..])] {
        let store = CacheEvent::stored(Some(parent), vec![block], tokens.to_vec());
        let o = index
            .apply_event(W0, 3, &store.with_tier(Tier::Host))
            .unwrap();
        assert_eq!(o.unknown_parent_blocks, 0);
    }
    assert_eq!(
        index.cached_tokens_by_tier(W0, &RouteRequest::new(&prompt)),
        [0, 48, 0, 0]
    );
}

/// A sliding-window group frees blocks that leave its window, so its store's parent is often
/// gone from that group; the hash names a position in every group, so the full-attention
/// group's block continues it. vLLM caches only the window blocks a later hit can use: such a
/// store names fewer blocks than its tokens, each matched by hash.
#[test]
fn a_sliding_window_store_continues_where_its_own_group_forgot() {
    let index = CacheIndex::new(IndexConfig::default()).unwrap();
    let prompt = tokens(6, 4);
    let window = |e: CacheEvent| {
        e.with_group(1)
            .with_group_kind(GroupKind::SlidingWindow { tokens: 32 })
    };
    let apply = |e: CacheEvent| index.apply_event(W0, 0, &e).unwrap();
    apply(CacheEvent::stored(None, vec![1, 2], prompt[..32].to_vec()));
    apply(window(CacheEvent::stored(
        None,
        vec![1, 2],
        prompt[..32].to_vec(),
    )));
    apply(window(CacheEvent::removed(vec![1, 2])));
    apply(CacheEvent::stored(
        Some(2),
        vec![3, 4],
        prompt[32..].to_vec(),
    ));
    let o = apply(window(CacheEvent::stored(
        Some(2),
        vec![3, 4],
        prompt[32..].to_vec(),
    )));
    assert_eq!((o.stored_blocks, o.unknown_parent_blocks), (2, 0));
    // A window of 32 tokens needs the ⌈31 / 16⌉ = 2 blocks before the hit's end.
    assert_eq!(index.cached_tokens(W0, &[], &prompt), 64);
    // A store naming only the last block of its two.
    let more = tokens(7, 2);
    let longer = [prompt.clone(), more.clone()].concat();
    apply(CacheEvent::stored(Some(4), vec![5, 6], more.clone()));
    let sparse = window(CacheEvent::stored(Some(4), vec![6], more.clone()).with_block_size(16));
    let o = apply(sparse);
    assert_eq!((o.stored_blocks, o.unknown_parent_blocks), (1, 0));
    assert_eq!(
        index.cached_tokens(W0, &[], &longer),
        64,
        "block 5 is not in the window group: a hit can end at 4 blocks, not 6"
    );
    // The main group may not name fewer blocks than its tokens.
    let bad = CacheEvent::stored(Some(4), vec![6], more).with_block_size(16);
    assert!(matches!(
        index.apply_event(W0, 0, &bad),
        Err(Error::InvalidEvent(_))
    ));
}

/// vLLM's self-describing CPU stores carry the LoRA name but no extra keys, so a salted
/// prompt's first chunk comes without its cache salt. The device's store of the same
/// blocks named the salt: the host copy stays in the prompt's namespace, after the device
/// dropped the blocks too (found by the conformance grid: an offloading engine serving
/// salted tenants).
#[test]
fn a_host_copy_without_the_cache_salt_keeps_the_prompts_namespace() {
    for drop_device_first in [false, true] {
        let index = CacheIndex::new(IndexConfig::default().with_host_chunk_blocks(2)).unwrap();
        let salt = namespace_salt(Some("finance"), Some("tenant-a"));
        let lora = namespace_salt(Some("finance"), None);
        let t = tokens(9, 4);
        let mut seq = 0;
        let mut apply = |event: CacheEvent| {
            index.apply_event(W0, seq, &event).unwrap();
            seq += 1;
        };
        // The worker has a lower tier already (a copy of other blocks), so records it
        // drops are kept a while.
        let other = tokens(10, 2);
        apply(CacheEvent::stored(None, vec![91, 92], other.clone()));
        apply(CacheEvent::stored(None, vec![91, 92], other).with_tier(Tier::Host));
        apply(CacheEvent::stored(None, vec![1, 2, 3, 4], t.clone()).with_salt(salt.clone()));
        let copy = |blocks: Vec<u64>, parent, tokens: &[u32]| {
            CacheEvent::stored(parent, blocks, tokens.to_vec())
                .with_salt(lora.clone())
                .with_tier(Tier::Host)
        };
        if drop_device_first {
            apply(CacheEvent::removed(vec![4, 3, 2, 1]));
        }
        apply(copy(vec![1, 2], None, &t[..32]));
        apply(copy(vec![3, 4], Some(2), &t[32..]));
        if !drop_device_first {
            apply(CacheEvent::removed(vec![4, 3, 2, 1]));
        }
        let mut prompt = t.clone();
        prompt.push(7);
        assert_eq!(index.reusable_tokens(W0, &salt, &prompt), 64);
        assert_eq!(
            index.reusable_tokens(W0, &lora, &prompt),
            0,
            "not the LoRA's alone"
        );
    }
}

/// One worker of a hybrid model (group 1 a sliding window of `window` tokens) offloading
/// in chunks of 4 blocks: group 0 stores a 25-block prompt, both groups' CPU copies of the
/// chunks listed are announced (placeholders naming each chunk's last block), then the
/// device keeps its first `device` blocks in both groups. Returns what it would reuse of
/// the first `prompt` tokens, and what a plain worker given the same group-0 events would.
fn hybrid_offload_hit(
    window: usize,
    device: usize,
    fa_chunks: &[usize],
    sw_chunks: &[usize],
    prompt: usize,
) -> (usize, usize) {
    let index = CacheIndex::new(IndexConfig::default()).unwrap();
    let t = tokens(13, 25);
    let engine: Vec<u64> = (1..=25).collect();
    let hybrid = EngineSettings::default()
        .with_group(1, GroupKind::SlidingWindow { tokens: window })
        .with_host_chunk_blocks(4);
    index.set_engine_settings(W0, &hybrid).unwrap();
    index
        .set_engine_settings(W1, &EngineSettings::default().with_host_chunk_blocks(4))
        .unwrap();
    for w in [W0, W1] {
        let mut seq = 0;
        let mut apply = |event: CacheEvent| {
            let o = index.apply_event(w, seq, &event).unwrap();
            assert_eq!((o.unknown_blocks, o.skipped_blocks), (0, 0));
            seq += 1;
        };
        apply(CacheEvent::stored(None, engine.clone(), t.clone()));
        let last = |chunks: &[usize]| chunks.iter().map(|k| engine[k * 4 + 3]).collect::<Vec<_>>();
        apply(CacheEvent::placeholder(last(fa_chunks), Tier::Host));
        if w == W0 && !sw_chunks.is_empty() {
            apply(CacheEvent::placeholder(last(sw_chunks), Tier::Host).with_group(1));
        }
        let dropped: Vec<u64> = engine[device..].iter().rev().copied().collect();
        apply(CacheEvent::removed(dropped));
        if w == W0 && device > 0 {
            let kept =
                CacheEvent::stored(None, engine[..device].to_vec(), t[..device * 16].to_vec())
                    .with_group(1);
            apply(kept);
        }
    }
    let p = &t[..prompt];
    (
        index.reusable_tokens(W0, &[], p),
        index.reusable_tokens(W1, &[], p),
    )
}

/// vLLM's CPU lookup for a hybrid model (`_lookup_complete_chunks` with a sliding-window
/// group, as vLLM 0.33's connector answers with the chunks held by hand; chunks of 64
/// tokens, a 400-token prompt whose group-0 chunks 0-5 are on the CPU): the window group
/// cuts the load to the last run of chunks it holds covering its window, scanned from the
/// right, or to its chunks held from the lookup's start; a plain worker with the same
/// group-0 chunks loads them all.
#[test]
fn a_hybrid_models_cpu_chunks_load_as_far_as_its_window_group_holds_them() {
    let all = [0, 1, 2, 3, 4, 5];
    // Window 128 (2 chunks), the window group holding chunks 2 and 3: the load ends at
    // chunk 4 whatever the device hit (0, 8 or 12 blocks) it starts from.
    for device in [0, 8, 12] {
        assert_eq!(
            hybrid_offload_hit(128, device, &all, &[2, 3], 400),
            (256, 384)
        );
    }
    assert_eq!(hybrid_offload_hit(128, 0, &all, &[2, 3, 4, 5], 400).0, 384);
    // Window 512 (8 chunks) is longer than the prompt's 6: nothing from the start unless
    // the window group holds every chunk from 0; from a device hit of 18 blocks the
    // chunks before the lookup's start (chunk 4) count as held.
    assert_eq!(hybrid_offload_hit(512, 0, &all, &[2, 3, 4, 5], 400).0, 0);
    assert_eq!(hybrid_offload_hit(512, 0, &all, &all, 400).0, 384);
    assert_eq!(hybrid_offload_hit(512, 18, &all, &[2, 3, 4, 5], 400).0, 384);
    // The window group holds nothing: nothing loads.
    assert_eq!(hybrid_offload_hit(128, 0, &all, &[], 400), (0, 384));
    // A gap in group 0 stops the load before the window group is asked.
    assert_eq!(
        hybrid_offload_hit(128, 0, &[0, 1, 3, 4, 5], &all, 400),
        (128, 128)
    );
}

/// With a sliding-window group offloaded, vLLM leaves the prompt's last token to compute:
/// a 384-token prompt of whole chunks loads 383 tokens, and so does the mirror. A plain
/// worker loads the whole prompt.
#[test]
fn a_hybrid_models_cpu_load_to_a_prompts_end_leaves_its_last_token() {
    let all = [0, 1, 2, 3, 4, 5];
    assert_eq!(hybrid_offload_hit(128, 0, &all, &all, 384), (383, 384));
    // The prompt ends inside a block: whole chunks only, to 320 for both.
    assert_eq!(hybrid_offload_hit(128, 0, &all, &all, 383), (320, 320));
}

/// vLLM 0.33's `OffloadingConnectorScheduler._lookup_complete_chunks`, transcribed from its
/// Python for full-attention group 0 and at most one sliding-window group (no EAGLE, no
/// load cap, nothing pending): the tokens loaded beyond a device hit of `device` tokens,
/// for a prompt of `prompt` tokens with `keys` complete chunks of `chunk` tokens, group 0
/// holding the chunks `fa` marks and the window group (window in tokens) those it marks.
fn vllm_lookup(
    prompt: usize,
    device: usize,
    chunk: usize,
    keys: usize,
    fa: &[bool],
    window: Option<(usize, &[bool])>,
) -> usize {
    let cdiv = |a: usize, b: usize| a.div_ceil(b);
    let groups: Vec<Option<(usize, &[bool])>> =
        std::iter::once(None).chain(window.map(Some)).collect();
    let mut max_hit = prompt;
    if window.is_some() {
        max_hit -= 1;
    }
    let mut num_hit = 0;
    let mut lookup = groups.clone();
    while !lookup.is_empty() {
        let mut looked_up_sliding_window = false;
        let pass = std::mem::take(&mut lookup);
        for group in pass {
            max_hit = max_hit.min(keys * chunk);
            if (max_hit as i64) - (device as i64) < chunk as i64 {
                return 0;
            }
            let num_chunks = cdiv(max_hit, chunk).min(keys);
            let start = device / chunk;
            let hits = match group {
                None => fa[start..num_chunks].iter().take_while(|&&h| h).count(),
                Some((w, held)) => {
                    let in_chunks = cdiv(w, chunk);
                    let candidate_end = max_hit.min(num_chunks * chunk);
                    let padding = (chunk - candidate_end % chunk) % chunk;
                    let initial = in_chunks.max(cdiv(w - 1 + padding, chunk));
                    // _sliding_window_lookup
                    let keys = &held[start..num_chunks];
                    let (mut consecutive, mut required, mut found) = (0, initial, None);
                    for idx in (0..keys.len()).rev() {
                        if keys[idx] {
                            consecutive += 1;
                        } else {
                            consecutive = 0;
                            required = in_chunks;
                        }
                        if consecutive == required {
                            found = Some(idx + required);
                            break;
                        }
                    }
                    found.unwrap_or(consecutive)
                }
            };
            if hits == 0 {
                return 0;
            }
            max_hit = max_hit.min(chunk * (start + hits));
            let new_num_hit = max_hit - device;
            if new_num_hit < chunk {
                return 0;
            }
            if new_num_hit < num_hit && looked_up_sliding_window && lookup.is_empty() {
                lookup = groups[1..].to_vec();
            }
            looked_up_sliding_window |= group.is_some();
            num_hit = new_num_hit;
        }
    }
    num_hit
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Against vLLM's lookup transcribed: every prompt length (whole blocks or not), chunk
    /// of 1, 2 or 4 blocks, device hit (inside a chunk or at its end), set of group-0 CPU
    /// chunks and, for a hybrid model, window and set of window-group CPU chunks, the
    /// mirror's reusable tokens are vLLM's device hit plus what it loads.
    #[test]
    fn cpu_loads_follow_vllms_lookup(
        blocks in 1usize..=20,
        partial in prop_oneof![Just(0usize), 1usize..16],
        chunk_blocks in prop_oneof![Just(1usize), Just(2), Just(4)],
        window in prop_oneof![
            Just(None),
            Just(Some(16usize)),
            Just(Some(64)),
            Just(Some(100)),
            Just(Some(128)),
            Just(Some(512)),
        ],
        device_pick in 0usize..=20,
        fa_bits in any::<u32>(),
        sw_bits in any::<u32>(),
    ) {
        let prompt = blocks * 16 + partial;
        let device = device_pick.min((prompt - 1) / 16);
        let keys = blocks / chunk_blocks;
        let fa: Vec<bool> = (0..keys).map(|k| fa_bits >> k & 1 == 1).collect();
        let sw: Vec<bool> = (0..keys).map(|k| sw_bits >> k & 1 == 1).collect();

        let index = CacheIndex::new(IndexConfig::default()).unwrap();
        let mut settings = EngineSettings::default().with_host_chunk_blocks(chunk_blocks);
        if let Some(w) = window {
            settings = settings.with_group(1, GroupKind::SlidingWindow { tokens: w });
        }
        index.set_engine_settings(W0, &settings).unwrap();
        let t = tokens(21, blocks + 1);
        let engine: Vec<u64> = (1..=blocks as u64).collect();
        let mut seq = 0;
        let mut apply = |event: CacheEvent| {
            let o = index.apply_event(W0, seq, &event).unwrap();
            prop_assert_eq!((o.unknown_blocks, o.skipped_blocks), (0, 0));
            seq += 1;
            Ok(())
        };
        apply(CacheEvent::stored(None, engine.clone(), t[..blocks * 16].to_vec()))?;
        let last = |held: &[bool]| -> Vec<u64> {
            (0..keys).filter(|&k| held[k]).map(|k| engine[(k + 1) * chunk_blocks - 1]).collect()
        };
        apply(CacheEvent::placeholder(last(&fa), Tier::Host))?;
        if window.is_some() {
            apply(CacheEvent::placeholder(last(&sw), Tier::Host).with_group(1))?;
        }
        apply(CacheEvent::removed(engine[device..].iter().rev().copied().collect()))?;
        if window.is_some() && device > 0 {
            let kept = CacheEvent::stored(None, engine[..device].to_vec(), t[..device * 16].to_vec())
                .with_group(1);
            apply(kept)?;
        }

        let window = window.map(|w| (w, sw.as_slice()));
        let loaded = vllm_lookup(prompt, device * 16, chunk_blocks * 16, keys, &fa, window);
        let vllm = device * 16 + loaded;
        prop_assert_eq!(index.reusable_tokens(W0, &[], &t[..prompt]), vllm);
    }
}
