//! The public API contract of DESIGN.md, written as a user would: if a name or a shape there
//! changes, this stops compiling.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Arc;

use prefix_router::{
    AffinityRouter, BalancedRouter, BlockHash, CacheAwareRouter, CacheEvent, CacheSync,
    ConsistentHashRouter, Error, HashAlgorithm, LeastLoadedRouter, PowerOfTwoRouter, PrefixHasher,
    PrefixMatch, RadixTree, RoundRobinRouter, RouteDecision, RouteRequest, Router, Tier, TokenId,
    WorkerId,
};

#[test]
fn every_contract_name_has_its_shape() {
    let token: TokenId = 151_935u32;
    let hasher: PrefixHasher = PrefixHasher::new(16).unwrap();
    let sha = PrefixHasher::with_algorithm(16, HashAlgorithm::Sha256).unwrap();
    assert!(matches!(HashAlgorithm::Xxh3, HashAlgorithm::Xxh3));
    assert_eq!(hasher.block_size(), 16);
    let tokens = vec![token; 64];
    let hashes: Vec<BlockHash> = hasher.hash(&tokens);
    let salted: Vec<BlockHash> = sha.hash_salted(b"tenant", &tokens);
    assert_eq!((hashes.len(), salted.len()), (4, 4));
    let h: BlockHash = hashes[0];
    let copy = h; // Copy
    let _: u64 = copy.get();
    let set: HashSet<BlockHash> = hashes.iter().copied().collect(); // Eq + Hash
    assert_eq!(set.len(), 4);
    let _ = format!("{h:?}"); // Debug

    let w: WorkerId = WorkerId::new(3);
    let _: u32 = w.get();
    assert!(WorkerId::new(1) < w); // Ord

    let mut tree: RadixTree = RadixTree::new();
    tree.insert(w, &hashes);
    let m: PrefixMatch = tree.match_prefix(&hashes);
    assert_eq!(m.matched_blocks(w), 4);
    assert_eq!(m.best(), Some((w, 4)));
    tree.set_capacity(w, 3);
    assert_eq!((tree.block_count(), tree.worker_block_count(w)), (3, 3));
    tree.remove(w, &hashes[1..]);
    assert_eq!(tree.worker_block_count(w), 1);
    tree.remove_worker(w);
    assert!(tree.memory_bytes() > 0);

    let request: RouteRequest<'_> = RouteRequest::new(&tokens).with_session("s");
    let routers: Vec<Arc<dyn Router>> = vec![
        Arc::new(RoundRobinRouter::new(2).unwrap()),
        Arc::new(LeastLoadedRouter::new(2).unwrap()),
        Arc::new(PowerOfTwoRouter::new(2).unwrap()),
        Arc::new(ConsistentHashRouter::new(2).unwrap()),
        Arc::new(AffinityRouter::new(2).unwrap()),
        Arc::new(BalancedRouter::new(2).unwrap()),
        Arc::new(CacheAwareRouter::new(2).unwrap()),
    ];
    for router in routers {
        let d: RouteDecision = router.route(&request).unwrap();
        let _: WorkerId = d.worker();
        let _: usize = d.cached_tokens();
        router.complete(&d);
        router.add_worker(WorkerId::new(2)).unwrap();
        router.remove_worker(WorkerId::new(2)).unwrap();
    }

    let balanced = BalancedRouter::new(1).unwrap();
    let sync: &dyn CacheSync = &balanced;
    let event: CacheEvent = CacheEvent::stored(None, vec![1, 2], tokens[..32].to_vec());
    assert!(matches!(
        &event,
        CacheEvent::Stored {
            parent: None,
            blocks,
            tokens: _,
            ..
        } if blocks == &[1, 2]
    ));
    sync.apply_event(WorkerId::new(0), 0, &event).unwrap();
    let host: CacheEvent =
        CacheEvent::stored(Some(2), vec![3], tokens[32..48].to_vec()).with_tier(Tier::Host);
    sync.apply_event(WorkerId::new(0), 0, &host).unwrap();
    assert_eq!(Tier::default(), Tier::Device);
    let tiers = [Tier::Device, Tier::Host, Tier::Disk, Tier::Remote];
    assert_eq!(tiers.len(), 4);
    assert!(matches!(
        CacheEvent::removed(vec![9]),
        CacheEvent::Removed { blocks, .. } if blocks == [9]
    ));
    sync.apply_event(WorkerId::new(0), 1, &CacheEvent::removed(vec![2]))
        .unwrap();
    sync.apply_event(WorkerId::new(0), 2, &CacheEvent::Cleared)
        .unwrap();
    sync.replace_worker_cache(WorkerId::new(0), &[&tokens[..]])
        .unwrap();
    sync.report_cached(WorkerId::new(0), &tokens, 16).unwrap();
    let _: &dyn CacheSync = balanced.index();
    let _: &dyn CacheSync = &CacheAwareRouter::new(1).unwrap();

    let err: Error = PrefixHasher::new(0).unwrap_err();
    assert!(!err.to_string().is_empty());
}

#[cfg(feature = "vllm")]
#[test]
fn the_vllm_decoder_has_its_shape() {
    use prefix_router::sync::vllm::{EngineEvent, EventBatch, decode_batch};
    // [0.0, [["BlockRemoved", [7]]], 2]
    let payload = [
        0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x92, 0xac, b'B', b'l', b'o', b'c', b'k', b'R',
        b'e', b'm', b'o', b'v', b'e', b'd', 0x91, 0x07, 0x02,
    ];
    let EventBatch {
        ts,
        events,
        data_parallel_rank,
    } = decode_batch(&payload).unwrap();
    assert_eq!((ts, data_parallel_rank), (0.0, Some(2)));
    match &events[0] {
        EngineEvent::BlockRemoved { block_hashes, .. } => assert_eq!(block_hashes, &[7]),
        other => panic!("{other:?}"),
    }
}
