//! Keeping the mirror honest: events, snapshots, miss feedback.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use common::{prompt_strategy, tokens};
use prefix_router::*;
use proptest::prelude::*;

use crate::common;

const W0: WorkerId = WorkerId::new(0);
const W1: WorkerId = WorkerId::new(1);

fn stored(parent: Option<u64>, blocks: &[u64], tokens: &[u32]) -> CacheEvent {
    CacheEvent::stored(parent, blocks.to_vec(), tokens.to_vec())
}

fn cached(router: &BalancedRouter, worker: WorkerId, tokens: &[u32]) -> usize {
    router.index().cached_tokens(worker, &[], tokens)
}

#[test]
fn stored_events_continue_from_the_parent_and_removals_drop_what_hangs_below() {
    let router = BalancedRouter::new(2).unwrap();
    let t = tokens(1, 4);
    let o = router
        .apply_event(W0, 0, &stored(None, &[100, 101], &t[..32]))
        .unwrap();
    assert_eq!((o.stored_blocks, o.sequence), (2, Sequence::InOrder));
    router
        .apply_event(W0, 0, &stored(Some(101), &[102, 103], &t[32..]))
        .unwrap();
    assert_eq!(cached(&router, W0, &t), 64);
    assert_eq!(cached(&router, W1, &t), 0);
    // Removing a parent whose child remains: the child can no longer be reached.
    let o = router
        .apply_event(W0, 1, &CacheEvent::removed(vec![102]))
        .unwrap();
    assert_eq!(o.removed_blocks, 1);
    assert_eq!(cached(&router, W0, &t), 32);
    // The child's own removal later is accepted (it was already out of the tree).
    let o = router
        .apply_event(W0, 2, &CacheEvent::removed(vec![103, 999]))
        .unwrap();
    assert_eq!((o.removed_blocks, o.unknown_removed_blocks), (1, 1));
    // A store whose parent was removed is skipped and counted.
    let o = router
        .apply_event(W0, 3, &stored(Some(103), &[104], &tokens(9, 1)))
        .unwrap();
    assert_eq!((o.stored_blocks, o.unknown_parent_blocks), (0, 1));
    assert_eq!(cached(&router, W0, &t), 32);
    router.index().with_tree(|t| t.validate()).unwrap();
}

#[test]
fn evicting_last_block_first_and_storing_below_an_evicted_ancestor() {
    let router = BalancedRouter::new(1).unwrap();
    let t = tokens(2, 6);
    router
        .apply_event(W0, 0, &stored(None, &[1, 2, 3], &t[..48]))
        .unwrap();
    router
        .apply_event(W0, 0, &stored(Some(3), &[4, 5, 6], &t[48..]))
        .unwrap();
    assert_eq!(cached(&router, W0, &t), 96);
    // An engine evicts a finished request's blocks last first: each removal leaves the
    // mirror one block shorter.
    for (i, block) in [6u64, 5, 4].into_iter().enumerate() {
        let o = router
            .apply_event(W0, 1, &CacheEvent::removed(vec![block]))
            .unwrap();
        assert_eq!(o.removed_blocks, 1);
        assert_eq!(cached(&router, W0, &t), 80 - 16 * i);
    }
    // Block 3 is a chain tip again; a new request continues from it.
    router
        .apply_event(W0, 2, &stored(Some(3), &[14], &t[48..64]))
        .unwrap();
    assert_eq!(cached(&router, W0, &t), 64);
    // Evicting an ancestor (2) cuts off the tip below it (14): a later store continuing
    // from that tip has an unknown parent, however recently the tip was stored.
    router
        .apply_event(W0, 3, &CacheEvent::removed(vec![2]))
        .unwrap();
    assert_eq!(cached(&router, W0, &t), 16);
    let o = router
        .apply_event(W0, 4, &stored(Some(14), &[15], &t[64..80]))
        .unwrap();
    assert_eq!((o.stored_blocks, o.unknown_parent_blocks), (0, 1));
    assert_eq!(cached(&router, W0, &t), 16);
    // The engine recomputes block 2 under block 1: the chain below is reachable again.
    router
        .apply_event(W0, 5, &stored(Some(1), &[2], &t[16..32]))
        .unwrap();
    assert_eq!(cached(&router, W0, &t), 32);
    router.index().with_tree(|t| t.validate()).unwrap();
}

/// Far more chains grow and shrink at once than the table of remembered chain tips holds
/// (64 per worker, two per set): every event still lands under its parent, found by its tip
/// or else through the parent links, and nothing is reported unknown.
#[test]
fn many_interleaved_chains_grow_and_shrink_exactly() {
    let router = BalancedRouter::new(1).unwrap();
    let (chains, len) = (300usize, 12usize);
    let prompt = |c: usize| tokens(c as u32 + 1, len);
    let engine = |c: usize, i: usize| ((c as u64) << 16 | i as u64) + 1;
    let apply = |event: &CacheEvent| {
        let o = router.apply_event(W0, 0, event).unwrap();
        assert_eq!((o.unknown_parent_blocks, o.unknown_removed_blocks), (0, 0));
        o
    };
    let grow = |from: &dyn Fn(usize) -> usize| {
        // One block per event, the chains taking turns.
        for i in 0..len {
            for c in (0..chains).filter(|&c| i >= from(c)) {
                let parent = i.checked_sub(1).map(|p| engine(c, p));
                let t = &prompt(c)[i * 16..(i + 1) * 16];
                assert_eq!(apply(&stored(parent, &[engine(c, i)], t)).stored_blocks, 1);
            }
        }
    };
    grow(&|_| 0);
    for c in 0..chains {
        assert_eq!(cached(&router, W0, &prompt(c)), len * 16, "chain {c}");
    }
    // Chain c loses its last c % len blocks, last first, the chains taking turns.
    let kept = |c: usize| len - c % len;
    for k in 0..len {
        for c in (0..chains).filter(|&c| k < c % len) {
            let removed = CacheEvent::removed(vec![engine(c, len - 1 - k)]);
            assert_eq!(apply(&removed).removed_blocks, 1);
        }
    }
    for c in 0..chains {
        assert_eq!(cached(&router, W0, &prompt(c)), kept(c) * 16, "chain {c}");
    }
    // And grows back from where it was cut.
    grow(&kept);
    for c in 0..chains {
        assert_eq!(cached(&router, W0, &prompt(c)), len * 16, "chain {c}");
    }
    router.index().with_tree(|t| t.validate()).unwrap();
}

/// The usual deployment: the router inserts each routed prompt whole, then the worker's
/// engine publishes the same prompt's blocks as events while it runs it, many requests at
/// once. Each event's parent sits inside an edge the routed insert made, and the requests
/// outnumber the remembered chain tips; every store still lands, and the engine evicting
/// everything last block first leaves the mirror holding nothing for the worker.
#[test]
fn events_after_routed_prompts_land_and_evict_exactly() {
    let router = BalancedRouter::new(1).unwrap();
    let (requests, len, run) = (300usize, 16usize, 4usize);
    let prompt = |r: usize| tokens(r as u32 + 1, len);
    let engine = |r: usize, i: usize| ((r as u64) << 16 | i as u64) + 1;
    for r in 0..requests {
        let d = router.route(&RouteRequest::new(&prompt(r))).unwrap();
        assert_eq!(d.worker(), W0);
        router.complete(&d);
    }
    for r in 0..requests {
        assert_eq!(cached(&router, W0, &prompt(r)), len * 16, "routed {r}");
    }
    for k in 0..len / run {
        for r in 0..requests {
            let parent = k.checked_sub(1).map(|_| engine(r, k * run - 1));
            let blocks: Vec<u64> = (k * run..(k + 1) * run).map(|i| engine(r, i)).collect();
            let t = &prompt(r)[k * run * 16..(k + 1) * run * 16];
            let o = router
                .apply_event(W0, 0, &stored(parent, &blocks, t))
                .unwrap();
            assert_eq!((o.stored_blocks, o.unknown_parent_blocks), (run, 0));
        }
    }
    evict_last_block_first(&router, requests, len, engine, prompt);
}

/// Evicts every block of `requests` requests (`len` blocks each, engine hashes
/// `engine(r, i)`) from worker 0 as vLLM reports it, one block at a time, last block first
/// and the requests taking turns: each removal takes exactly one block off the request's
/// cached prefix, and nothing is left.
fn evict_last_block_first(
    router: &BalancedRouter,
    requests: usize,
    len: usize,
    engine: impl Fn(usize, usize) -> u64,
    prompt: impl Fn(usize) -> Vec<u32>,
) {
    for i in (0..len).rev() {
        for r in 0..requests {
            let removed = CacheEvent::removed(vec![engine(r, i)]);
            let o = router.apply_event(W0, 0, &removed).unwrap();
            assert_eq!((o.removed_blocks, o.unknown_removed_blocks), (1, 0));
            assert_eq!(cached(router, W0, &prompt(r)), i * 16, "request {r}");
        }
    }
    assert_eq!(router.index().with_tree(|t| t.worker_block_count(W0)), 0);
    router.index().with_tree(|t| t.validate()).unwrap();
}

/// Conversations come back for a second turn after more requests than the remembered chain
/// tips: each turn is routed whole first (so the previous turn's last block is inside an
/// edge when the engine stores below it), then stored in two events, the first ending
/// inside the routed edge. Every store lands where the engine says, and evicting
/// everything last block first leaves nothing.
#[test]
fn next_turns_after_forgotten_tips_land_exactly() {
    let router = BalancedRouter::new(1).unwrap();
    let (conversations, first, more, run) = (300usize, 6usize, 4usize, 2usize);
    let prompt = |c: usize| tokens(c as u32 + 1, first + more);
    let engine = |c: usize, i: usize| ((c as u64) << 16 | i as u64) + 1;
    let store = |c: usize, from: usize| {
        let blocks: Vec<u64> = (from..from + run).map(|i| engine(c, i)).collect();
        let t = &prompt(c)[from * 16..(from + run) * 16];
        let parent = from.checked_sub(1).map(|i| engine(c, i));
        let o = router
            .apply_event(W0, 0, &stored(parent, &blocks, t))
            .unwrap();
        assert_eq!((o.stored_blocks, o.unknown_parent_blocks), (run, 0), "{c}");
    };
    for turn_blocks in [first, first + more] {
        for c in 0..conversations {
            let d = router
                .route(&RouteRequest::new(&prompt(c)[..turn_blocks * 16]))
                .unwrap();
            router.complete(&d);
        }
        for from in (turn_blocks - if turn_blocks == first { first } else { more }..turn_blocks)
            .step_by(run)
        {
            for c in 0..conversations {
                store(c, from);
                assert_eq!(cached(&router, W0, &prompt(c)), turn_blocks * 16, "{c}");
            }
        }
        router.index().with_tree(|t| t.validate()).unwrap();
    }
    evict_last_block_first(&router, conversations, first + more, engine, prompt);
}

/// vLLM with `kv_cache_report_mode=full` reports a prefix hit again as a store of blocks the
/// worker already holds: with `full_reports` that is not a second copy, and one removal
/// removes the block.
#[test]
fn a_prefix_hit_reported_again_is_not_a_second_copy() {
    let config =
        CacheAwareConfig::default().with_index(IndexConfig::default().with_full_reports(true));
    let router = CacheAwareRouter::with_config(1, config).unwrap();
    let t = tokens(2, 2);
    router
        .apply_event(W0, 0, &stored(None, &[7, 8], &t))
        .unwrap();
    let o = router
        .apply_event(W0, 0, &stored(None, &[7, 8], &t))
        .unwrap();
    assert_eq!((o.stored_blocks, o.duplicate_blocks), (0, 2));
    assert_eq!(router.index().cached_tokens(W0, &[], &t), 32);
    let o = router
        .apply_event(W0, 1, &CacheEvent::removed(vec![8]))
        .unwrap();
    assert_eq!((o.removed_blocks, o.duplicate_blocks), (1, 0));
    assert_eq!(
        router.index().cached_tokens(W0, &[], &t),
        16,
        "gone after one removal"
    );
    let o = router
        .apply_event(W0, 1, &CacheEvent::removed(vec![8]))
        .unwrap();
    assert_eq!(
        o.unknown_removed_blocks, 1,
        "a second removal names an unknown block"
    );
    router.index().with_tree(|t| t.validate()).unwrap();
}

/// vLLM caches a block again when it recomputes it (here a prompt of two whole blocks:
/// vLLM always computes the last token, so it recomputes the second block), and reports
/// each copy's eviction: the block stays held until the last copy goes.
#[test]
fn a_recomputed_block_is_a_second_copy_until_its_last_eviction() {
    let router = CacheAwareRouter::new(1).unwrap();
    let t = tokens(2, 2);
    router
        .apply_event(W0, 0, &stored(None, &[7, 8], &t))
        .unwrap();
    let o = router
        .apply_event(W0, 1, &stored(Some(7), &[8], &t[16..]))
        .unwrap();
    assert_eq!((o.stored_blocks, o.duplicate_blocks), (0, 1));
    let o = router
        .apply_event(W0, 2, &CacheEvent::removed(vec![8]))
        .unwrap();
    assert_eq!(o.removed_blocks, 1);
    assert_eq!(
        router.index().cached_tokens(W0, &[], &t),
        32,
        "one copy is left"
    );
    router
        .apply_event(W0, 3, &CacheEvent::removed(vec![8]))
        .unwrap();
    assert_eq!(
        router.index().cached_tokens(W0, &[], &t),
        16,
        "the last copy went"
    );
    router.index().with_tree(|t| t.validate()).unwrap();
}

#[test]
fn sequence_gaps_restarts_and_clears() {
    let router = BalancedRouter::new(1).unwrap();
    let t = tokens(3, 2);
    let o = router
        .apply_event(W0, 5, &stored(None, &[1], &t[..16]))
        .unwrap();
    assert_eq!(
        o.sequence,
        Sequence::InOrder,
        "the first seq seen is in order"
    );
    let o = router
        .apply_event(W0, 5, &stored(Some(1), &[2], &t[16..]))
        .unwrap();
    assert_eq!(o.sequence, Sequence::InOrder, "same batch");
    let o = router
        .apply_event(W0, 6, &CacheEvent::removed(vec![]))
        .unwrap();
    assert_eq!(o.sequence, Sequence::InOrder, "next batch");
    let o = router
        .apply_event(W0, 9, &CacheEvent::removed(vec![]))
        .unwrap();
    assert_eq!(
        o.sequence,
        Sequence::Gap {
            expected: 7,
            received: 9
        }
    );
    assert_eq!(o.replay_from(), Some(7));
    assert_eq!(
        cached(&router, W0, &t),
        32,
        "a gap is applied, nothing is lost"
    );
    let o = router
        .apply_event(W0, 2, &CacheEvent::removed(vec![]))
        .unwrap();
    assert_eq!(
        o.sequence,
        Sequence::Restart {
            previous: 9,
            received: 2
        }
    );
    assert_eq!(
        cached(&router, W0, &t),
        0,
        "a restart clears the worker's mirror"
    );
    router
        .apply_event(W0, 3, &stored(None, &[1], &t[..16]))
        .unwrap();
    router.apply_event(W0, 4, &CacheEvent::Cleared).unwrap();
    assert_eq!(cached(&router, W0, &t), 0);
}

#[test]
fn bad_events_are_errors_and_change_nothing() {
    let router = BalancedRouter::new(1).unwrap();
    let err = router
        .apply_event(W0, 0, &stored(None, &[1, 2], &tokens(4, 4)))
        .unwrap_err();
    assert_eq!(
        err,
        Error::BlockSizeMismatch {
            engine: 32,
            router: 16
        }
    );
    assert!(
        err.to_string()
            .contains("32 tokens per block, the router hashes 16")
    );
    assert!(matches!(
        router.apply_event(W0, 0, &stored(None, &[1, 2], &tokens(4, 1)[..15])),
        Err(Error::InvalidEvent(_))
    ));
    assert_eq!(
        router.apply_event(WorkerId::new(5), 0, &CacheEvent::Cleared),
        Err(Error::UnknownWorker(WorkerId::new(5)))
    );
    assert!(router.report_cached(WorkerId::new(5), &[1], 0).is_err());
    assert!(router.replace_worker_cache(WorkerId::new(5), &[]).is_err());
    let index = CacheIndex::new(IndexConfig::default()).unwrap();
    assert!(matches!(
        index.apply_event(WorkerId::new(u32::MAX), 0, &CacheEvent::Cleared),
        Err(Error::WorkerOutOfRange { .. })
    ));
    // The failed events did not advance the sequence.
    let o = router.apply_event(W0, 0, &CacheEvent::Cleared).unwrap();
    assert_eq!(o.sequence, Sequence::InOrder);
}

#[test]
fn miss_feedback_and_snapshots_set_the_mirror_to_what_is_true() {
    let router = BalancedRouter::new(2).unwrap();
    let t = tokens(5, 8);
    let d = router.route(&RouteRequest::new(&t)).unwrap();
    router.complete(&d);
    let w = d.worker();
    assert_eq!(cached(&router, w, &t), 128);
    // A prompt sharing t's first 4 blocks was answered with only 40 tokens cached (2 whole
    // blocks): the mirror drops t from its third block on and holds the other prompt,
    // which the worker computed.
    let mut u = t[..64].to_vec();
    u.extend(tokens(9, 2));
    router.report_cached(w, &u, 40).unwrap();
    assert_eq!(cached(&router, w, &t), 64, "t's first 4 blocks, as u's");
    assert_eq!(cached(&router, w, &u), 96);
    // t answered with 1 block cached: u's blocks below it go, but for the 4 it shares.
    router.report_cached(w, &t, 16).unwrap();
    assert_eq!((cached(&router, w, &t), cached(&router, w, &u)), (128, 64));
    // More than predicted: the mirror grows to match.
    let fresh = tokens(10, 3);
    router.report_cached(w, &fresh, 48).unwrap();
    assert_eq!(cached(&router, w, &fresh), 48);
    let a = tokens(6, 3);
    let b = tokens(7, 2);
    router.replace_worker_cache(w, &[&a, &b]).unwrap();
    assert_eq!(cached(&router, w, &t), 0);
    assert_eq!((cached(&router, w, &a), cached(&router, w, &b)), (48, 32));
    router.index().with_tree(|t| t.validate()).unwrap();
}

#[test]
fn ttl_expires_what_was_not_routed_recently() {
    let mut config = BalancedConfig::default();
    config.index.ttl = Some(32);
    let router = BalancedRouter::with_config(1, config).unwrap();
    let old = tokens(8, 2);
    let d = router.route(&RouteRequest::new(&old)).unwrap();
    router.complete(&d);
    for i in 0..64 {
        let d = router
            .route(&RouteRequest::new(&tokens(100 + i, 1)))
            .unwrap();
        router.complete(&d);
    }
    assert_eq!(cached(&router, W0, &old), 0);
    assert_eq!(
        cached(&router, W0, &tokens(163, 1)),
        16,
        "recent prefixes stay"
    );
}

/// A modelled worker: a KV cache of `capacity` blocks with LRU eviction of leaves, keyed by
/// its own engine hashes (unrelated to the router's), emitting the events vLLM would.
struct ModelWorker {
    capacity: usize,
    /// engine hash -> (parent, last use)
    blocks: HashMap<u64, (Option<u64>, u64)>,
    clock: u64,
}

fn engine_hash(parent: Option<u64>, block: &[u32]) -> u64 {
    // Any chained function will do; deliberately not the router's.
    let mut h = parent.unwrap_or(0x1234_5678) ^ 0xA5A5_A5A5_A5A5_A5A5;
    for &t in block {
        h = (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

impl ModelWorker {
    fn hashes(prompt: &[u32]) -> Vec<u64> {
        let mut out = Vec::new();
        let mut parent = None;
        for block in prompt.chunks_exact(16) {
            let h = engine_hash(parent, block);
            out.push(h);
            parent = Some(h);
        }
        out
    }

    /// Leading blocks of `prompt` cached.
    fn cached_blocks(&self, prompt: &[u32]) -> usize {
        Self::hashes(prompt)
            .iter()
            .take_while(|h| self.blocks.contains_key(h))
            .count()
    }

    /// Serves `prompt`: uses what is cached, stores the rest, evicts beyond capacity.
    fn serve(&mut self, prompt: &[u32]) -> Vec<CacheEvent> {
        self.clock += 1;
        let hashes = Self::hashes(prompt);
        let hit = self.cached_blocks(prompt);
        for h in &hashes[..hit] {
            self.blocks.get_mut(h).unwrap().1 = self.clock;
        }
        let mut events = Vec::new();
        if hit < hashes.len() {
            let parent = hit.checked_sub(1).map(|i| hashes[i]);
            for (i, &h) in hashes.iter().enumerate().skip(hit) {
                let p = i.checked_sub(1).map(|i| hashes[i]);
                self.blocks.insert(h, (p, self.clock));
            }
            events.push(CacheEvent::stored(
                parent,
                hashes[hit..].to_vec(),
                prompt[hit * 16..hashes.len() * 16].to_vec(),
            ));
        }
        let mut removed = Vec::new();
        while self.blocks.len() > self.capacity {
            // The least recently used leaf (deepest first among equals: no cached child).
            let parents: std::collections::HashSet<u64> =
                self.blocks.values().filter_map(|(p, _)| *p).collect();
            let victim = self
                .blocks
                .iter()
                .filter(|(h, _)| !parents.contains(h))
                .min_by_key(|(h, (_, used))| (*used, **h))
                .map(|(h, _)| *h)
                .unwrap();
            self.blocks.remove(&victim);
            removed.push(victim);
        }
        if !removed.is_empty() {
            events.push(CacheEvent::removed(removed));
        }
        events
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A router fed its workers' events predicts exactly each worker's cached prefix, and
    /// two replicas fed the same events agree on every match: up to four workers, each a
    /// modelled LRU cache of its own capacity serving the prompts routed to it, each with its
    /// own event sequence.
    #[test]
    fn event_fed_mirror_predicts_the_true_cache(
        requests in prop::collection::vec((prompt_strategy(), 0usize..4), 1..40),
        capacities in prop::collection::vec(1usize..24, 1..5),
    ) {
        let n = capacities.len();
        let replicas = [0, 1].map(|_| BalancedRouter::new(n as u32).unwrap());
        let mut workers: Vec<ModelWorker> = capacities
            .iter()
            .map(|&capacity| ModelWorker { capacity, blocks: HashMap::new(), clock: 0 })
            .collect();
        let mut seqs = vec![0u64; n];
        for (prompt, w) in &requests {
            let w = w % n;
            let worker = WorkerId::new(w as u32);
            for event in workers[w].serve(prompt) {
                for r in &replicas {
                    let o = r.apply_event(worker, seqs[w], &event).unwrap();
                    prop_assert_eq!(o.sequence, Sequence::InOrder);
                    prop_assert_eq!(o.unknown_parent_blocks, 0);
                }
                seqs[w] += 1;
            }
            for r in &replicas {
                r.index().with_tree(|t| t.validate()).unwrap();
            }
            for (later, _) in &requests {
                for (v, model) in workers.iter().enumerate() {
                    let truth = model.cached_blocks(later) * 16;
                    let worker = WorkerId::new(v as u32);
                    prop_assert_eq!(cached(&replicas[0], worker, later), truth);
                    prop_assert_eq!(cached(&replicas[1], worker, later), truth);
                }
            }
        }
    }
}

#[cfg(feature = "vllm")]
mod vllm_vectors {
    use super::*;
    use prefix_router::sync::vllm::{EngineEvent, decode_batch};
    use serde_json::Value;

    const VARIANTS: [&str; 5] = [
        "legacy_array_u64",
        "array_lora_name_u64",
        "map_u64",
        "map_bytes",
        "array_i64",
    ];

    fn dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/vllm")
    }

    /// The fields the expectations pin: stored (hashes, parent, tokens, block size),
    /// removed (hashes), cleared.
    #[derive(Debug, PartialEq)]
    enum Core {
        Stored(Vec<u64>, Option<u64>, Vec<u32>, usize),
        Removed(Vec<u64>),
        Cleared,
    }

    fn expected_event(e: &Value) -> Core {
        let hashes = |k: &str| -> Vec<u64> {
            e[k].as_array()
                .unwrap()
                .iter()
                .map(|h| h.as_u64().unwrap())
                .collect()
        };
        match e["type"].as_str().unwrap() {
            "BlockStored" => Core::Stored(
                hashes("block_hashes"),
                e["parent_block_hash"].as_u64(),
                e["token_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_u64().unwrap() as u32)
                    .collect(),
                e["block_size"].as_u64().unwrap() as usize,
            ),
            "BlockRemoved" => Core::Removed(hashes("block_hashes")),
            "AllBlocksCleared" => Core::Cleared,
            other => panic!("unknown type {other}"),
        }
    }

    /// The decoded event's pinned fields.
    fn core(e: &EngineEvent) -> Core {
        match e.clone() {
            EngineEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                ..
            } => Core::Stored(block_hashes, parent_block_hash, token_ids, block_size),
            EngineEvent::BlockRemoved { block_hashes, .. } => Core::Removed(block_hashes),
            EngineEvent::AllBlocksCleared => Core::Cleared,
            other => panic!("unexpected event {other:?}"),
        }
    }

    #[test]
    fn every_wire_variant_decodes_to_the_expected_events_and_the_same_mirror() {
        let mut mirrors = Vec::new();
        for variant in VARIANTS {
            let expected: Value = serde_json::from_str(
                &std::fs::read_to_string(dir().join(variant).join("expected.json")).unwrap(),
            )
            .unwrap();
            let router = BalancedRouter::new(1).unwrap();
            let mut prompts: Vec<Vec<u32>> = Vec::new();
            for batch in expected.as_array().unwrap() {
                let file = batch["file"].as_str().unwrap();
                let payload = std::fs::read(dir().join(variant).join(file)).unwrap();
                let decoded = decode_batch(&payload).unwrap();
                assert_eq!(
                    decoded.ts,
                    batch["ts"].as_f64().unwrap(),
                    "{variant}/{file}"
                );
                assert_eq!(
                    decoded.data_parallel_rank,
                    batch["data_parallel_rank"].as_u64().map(|r| r as u32)
                );
                let want: Vec<Core> = batch["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(expected_event)
                    .collect();
                let got: Vec<Core> = decoded.events.iter().map(core).collect();
                assert_eq!(got, want, "{variant}/{file}");
                let seq = batch["seq"].as_u64().unwrap();
                for event in &decoded.events {
                    if let EngineEvent::BlockStored { medium, .. } = event {
                        assert_eq!(medium.as_deref(), Some("GPU"), "{variant}: medium kept");
                    }
                    if let CacheEvent::Stored { tokens, .. } = event.to_cache_event() {
                        prompts.push(tokens);
                    }
                    router
                        .apply_event(W0, seq, &event.to_cache_event())
                        .unwrap();
                }
                router.index().with_tree(|t| t.validate()).unwrap();
            }
            // The last batch clears everything.
            let after: Vec<usize> = prompts.iter().map(|p| cached(&router, W0, p)).collect();
            assert!(after.iter().all(|&c| c == 0), "{variant}: {after:?}");
            mirrors.push(router);
        }
        // Replay all but the final clear and compare the mirrors across variants.
        let states: Vec<Vec<usize>> = VARIANTS
            .iter()
            .map(|variant| {
                let router = BalancedRouter::new(1).unwrap();
                let mut probes = Vec::new();
                for i in 0..4 {
                    let payload =
                        std::fs::read(dir().join(variant).join(format!("batch_0{i}.msgpack")))
                            .unwrap();
                    for event in decode_batch(&payload).unwrap().events {
                        if let CacheEvent::Stored { tokens, .. } = event.to_cache_event() {
                            probes.push(tokens);
                        }
                        router.apply_event(W0, i, &event.to_cache_event()).unwrap();
                    }
                }
                probes.iter().map(|p| cached(&router, W0, p)).collect()
            })
            .collect();
        assert!(states.iter().all(|s| s == &states[0]), "{states:?}");
        assert!(states[0].iter().any(|&c| c > 0));
    }

    #[test]
    fn malformed_payloads_are_errors() {
        let good = std::fs::read(dir().join("map_u64/batch_01.msgpack"));
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", vec![]),
            ("a bare integer", vec![0x05]),
            (
                "array32 claiming 4 billion items",
                vec![0xdd, 0xff, 0xff, 0xff, 0xff, 0x01],
            ),
            ("bin32 claiming 4 GiB", vec![0xc6, 0xff, 0xff, 0xff, 0xff]),
            (
                "batch without events",
                vec![0x91, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            ("events not an array", vec![0x92, 0x00, 0x05]),
            (
                "event with unknown tag",
                vec![0x92, 0x00, 0x91, 0x91, 0xa3, b'F', b'o', b'o'],
            ),
            ("ts a string", vec![0x92, 0xa1, b'x', 0x90]),
            ("trailing bytes", vec![0x92, 0x00, 0x90, 0x00]),
        ];
        for (what, payload) in cases {
            assert!(
                matches!(decode_batch(&payload), Err(Error::Decode(_))),
                "{what} must be a decode error"
            );
        }
        if let Ok(good) = good {
            for cut in [1, good.len() / 2, good.len() - 1] {
                assert!(decode_batch(&good[..cut]).is_err(), "truncated at {cut}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5_000))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_batch(&bytes);
        }
    }
}
