//! One test per row of the bad-input table (crate docs, "Bad input"): what each public entry
//! point does with each bad input it can receive.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use prefix_router::*;

const W0: WorkerId = WorkerId::new(0);

#[test]
fn row_block_size_zero_or_huge() {
    for bs in [0, PrefixHasher::MAX_BLOCK_SIZE + 1, usize::MAX] {
        assert!(matches!(
            PrefixHasher::new(bs),
            Err(Error::InvalidBlockSize { .. })
        ));
        let mut c = IndexConfig::default();
        c.block_size = bs;
        assert!(matches!(
            CacheIndex::new(c),
            Err(Error::InvalidBlockSize { .. })
        ));
    }
}

#[test]
fn row_empty_sub_block_and_huge_prompts() {
    let h = PrefixHasher::new(16).unwrap();
    assert!(h.hash(&[]).is_empty());
    assert!(h.hash(&[1; 15]).is_empty());
    let huge: Vec<u32> = (0..1_000_000).collect();
    assert_eq!(h.hash(&huge).len(), 62_500);
    let router = BalancedRouter::new(2).unwrap();
    for prompt in [&[][..], &[7; 15][..], &huge[..]] {
        let d = router.route(&RouteRequest::new(prompt)).unwrap();
        assert_eq!(d.cached_tokens(), 0);
        router.complete(&d);
    }
    let d = router.route(&RouteRequest::new(&huge)).unwrap();
    assert_eq!(
        d.cached_tokens(),
        1_000_000,
        "the 1M-token prompt is mirrored whole"
    );
    router.complete(&d);
}

#[test]
fn row_chain_longer_than_the_prompt() {
    let h = PrefixHasher::new(4).unwrap();
    let mut chain = h.hash(&[1; 40]);
    h.extend_chain(&[], &[1; 8], &mut chain);
    assert_eq!(chain.len(), 10);
}

#[test]
fn row_tree_worker_id_out_of_range_or_unknown() {
    let mut t = RadixTree::new();
    let bad = WorkerId::new(RadixTree::MAX_WORKERS);
    let blocks = [BlockHash::new(1), BlockHash::new(2)];
    t.insert(bad, &blocks);
    t.set_capacity(bad, 1);
    t.touch(bad, &blocks);
    t.remove(WorkerId::new(9), &blocks);
    t.truncate(WorkerId::new(9), &blocks, 0);
    t.remove_worker(WorkerId::new(9));
    t.insert(W0, &[]);
    assert_eq!((t.block_count(), t.worker_block_count(bad)), (0, 0));
    t.validate().unwrap();
}

#[test]
fn row_tree_more_distinct_prompts_than_its_budget() {
    let mut c = TreeConfig::default();
    c.max_blocks = 20_000;
    c.max_nodes = 2_000;
    let mut config = IndexConfig::default();
    config.tree = c;
    let mut bc = BalancedConfig::default();
    bc.index = config;
    let router = BalancedRouter::with_config(8, bc).unwrap();
    let mut state = 88_172_645_463_325_252u64;
    let mut max_bytes = 0;
    for _ in 0..20_000 {
        let tokens: Vec<u32> = (0..256)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state % 151_936) as u32
            })
            .collect();
        let d = router.route(&RouteRequest::new(&tokens)).unwrap();
        router.complete(&d);
        max_bytes = max_bytes.max(router.index().memory_bytes());
    }
    let (blocks, nodes) = router
        .index()
        .with_tree(|t| (t.block_count(), t.node_count()));
    assert!(blocks <= 20_000 && nodes <= 2_000);
    // 16 B per block (pool with garbage, doubled capacity) and 256 B per node, generously.
    assert!(
        max_bytes < 20_000 * 16 + 2_000 * 256 + 64 * 1024,
        "{max_bytes} bytes"
    );
    router.index().with_tree(|t| t.validate()).unwrap();
}

#[test]
fn row_too_many_workers() {
    assert!(matches!(
        RoundRobinRouter::new(5_000),
        Err(Error::WorkerOutOfRange { .. })
    ));
    assert!(matches!(
        BalancedRouter::new(u32::MAX),
        Err(Error::WorkerOutOfRange { .. })
    ));
}

#[test]
fn row_nan_and_out_of_range_config() {
    let mut c = BalancedConfig::default();
    for alpha in [f64::NAN, f64::INFINITY, -0.1, 1.1] {
        c.alpha = alpha;
        assert!(matches!(
            BalancedRouter::with_config(1, c),
            Err(Error::InvalidConfig { field: "alpha", .. })
        ));
    }
    for weight in [
        MissWeight::Fixed(0.5),
        MissWeight::Fixed(f64::NAN),
        MissWeight::Fleet { max: 0.5 },
        MissWeight::Fleet { max: f64::INFINITY },
    ] {
        let c = BalancedConfig::default().with_miss_weight(weight);
        assert!(
            matches!(
                BalancedRouter::with_config(1, c),
                Err(Error::InvalidConfig {
                    field: "miss_weight",
                    ..
                })
            ),
            "{weight:?}"
        );
    }
    let load = LoadConfig::default().with_busy_horizon(Duration::ZERO);
    assert!(matches!(
        BalancedRouter::with_config(1, BalancedConfig::default().with_load(load)),
        Err(Error::InvalidConfig {
            field: "busy_horizon",
            ..
        })
    ));
    let mut c = ConsistentHashConfig::default();
    c.key_blocks = 0;
    assert!(ConsistentHashRouter::with_config(1, c).is_err());
    // Integers are checked as integers; a tree bound of 0 would evict everything.
    assert!(matches!(
        RadixTree::with_config(TreeConfig::default().with_max_blocks(0)),
        Err(Error::InvalidConfig {
            field: "max_blocks",
            ..
        })
    ));
    let index = IndexConfig::default().with_worker_capacity_blocks(Some(0));
    assert!(matches!(
        CacheIndex::new(index),
        Err(Error::InvalidConfig {
            field: "worker_capacity_blocks",
            ..
        })
    ));
    let index = IndexConfig::default().with_tree(TreeConfig::default().with_max_nodes(0));
    assert!(BalancedRouter::with_config(1, BalancedConfig::default().with_index(index)).is_err());
}

#[test]
fn row_unknown_mediums_groups_and_ranks() {
    // An unknown medium is the least credited tier.
    assert_eq!(Tier::from_medium("QUANTUM_FOAM"), Tier::Remote);
    let router = BalancedRouter::new(2).unwrap();
    let t: Vec<u32> = (0..32).collect();
    // A group beyond what the router tracks: skipped and counted.
    let far = CacheEvent::stored(None, vec![1, 2], t.clone()).with_group(1_000);
    let o = router.apply_event(W0, 0, &far).unwrap();
    assert_eq!((o.stored_blocks, o.skipped_blocks), (0, 2));
    // A placeholder naming a block never stored: skipped and counted.
    let o = router
        .apply_event(W0, 0, &CacheEvent::placeholder(vec![77], Tier::Host))
        .unwrap();
    assert_eq!(o.unknown_blocks, 1);
    // A rank beyond the layout: an error naming it.
    let layout = RankLayout::new(2).unwrap();
    assert!(matches!(
        layout.target(0, 5),
        Err(Error::InvalidRank { rank: 5, ranks: 2 })
    ));
    assert!(RankLayout::new(0).is_err());
    // Engine blocks finer than the router's are accepted; coarser ones are a mismatch.
    let fine = CacheEvent::stored(None, vec![5, 6, 7, 8], t.clone()).with_block_size(8);
    assert_eq!(router.apply_event(W0, 1, &fine).unwrap().stored_blocks, 2);
    let coarse = CacheEvent::stored(None, vec![9], t.clone()).with_block_size(32);
    assert!(matches!(
        router.apply_event(W0, 1, &coarse),
        Err(Error::BlockSizeMismatch {
            engine: 32,
            router: 16
        })
    ));
}

#[test]
fn row_policy_choice_out_of_range() {
    struct Beyond;
    impl Policy for Beyond {
        fn name(&self) -> &'static str {
            "beyond"
        }
        fn select(&self, _: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
            candidates.len()
        }
    }
    let router = PolicyRouter::with_policy(2, Beyond, IndexConfig::default()).unwrap();
    assert!(matches!(
        router.route(&RouteRequest::new(&[1, 2, 3])),
        Err(Error::InvalidChoice {
            index: 2,
            candidates: 2,
            ..
        })
    ));
    assert_eq!(router.load(W0).unwrap().in_flight, 0, "nothing charged");
}

#[test]
fn row_no_available_worker() {
    let r = CacheAwareRouter::new(1).unwrap();
    r.set_available(W0, false).unwrap();
    assert_eq!(
        r.route(&RouteRequest::new(&[1])).unwrap_err(),
        Error::NoWorkers
    );
    r.remove_worker(W0).unwrap();
    assert_eq!(
        r.route(&RouteRequest::new(&[1])).unwrap_err(),
        Error::NoWorkers
    );
}

#[test]
fn row_completing_twice_or_after_removal() {
    let r = LeastLoadedRouter::new(2).unwrap();
    let d = r.route(&RouteRequest::new(&[1])).unwrap();
    r.complete(&d);
    r.complete(&d);
    r.first_token(&d);
    let d2 = r.route(&RouteRequest::new(&[1])).unwrap();
    r.remove_worker(d2.worker()).unwrap();
    r.complete(&d2);
    assert!(
        r.workers()
            .iter()
            .all(|&w| r.load(w).unwrap().in_flight == 0)
    );
}

#[test]
fn row_unknown_or_duplicate_workers() {
    let r = AffinityRouter::new(2).unwrap();
    let nine = WorkerId::new(9);
    assert_eq!(r.add_worker(W0), Err(Error::WorkerExists(W0)));
    assert_eq!(r.remove_worker(nine), Err(Error::UnknownWorker(nine)));
    assert_eq!(r.set_available(nine, true), Err(Error::UnknownWorker(nine)));
    assert_eq!(
        r.report_load(
            nine,
            EngineLoad::new(1, 0, Duration::ZERO).with_kv_usage(0.5)
        ),
        Err(Error::UnknownWorker(nine))
    );
    assert_eq!(
        r.set_profile(nine, WorkerProfile::default()),
        Err(Error::UnknownWorker(nine))
    );
    assert!(r.load(nine).is_none());
}

#[test]
fn row_reported_load_out_of_range() {
    let r = RoundRobinRouter::new(1).unwrap();
    for kv in [f64::NAN, -0.1, 1.5] {
        let load = EngineLoad::new(1, 0, Duration::ZERO).with_kv_usage(kv);
        assert!(matches!(
            r.report_load(W0, load),
            Err(Error::InvalidConfig {
                field: "kv_usage",
                ..
            })
        ));
    }
    for speed in [f64::NAN, 0.0, -1.0, f64::INFINITY] {
        assert!(matches!(
            r.set_profile(W0, WorkerProfile::default().with_speed(speed)),
            Err(Error::InvalidConfig { field: "speed", .. })
        ));
    }
}

#[test]
fn row_events_for_unknown_workers() {
    let r = BalancedRouter::new(1).unwrap();
    let nine = WorkerId::new(9);
    assert_eq!(
        r.apply_event(nine, 0, &CacheEvent::Cleared),
        Err(Error::UnknownWorker(nine))
    );
    let index = CacheIndex::new(IndexConfig::default()).unwrap();
    assert!(matches!(
        index.apply_event(WorkerId::new(u32::MAX), 0, &CacheEvent::Cleared),
        Err(Error::WorkerOutOfRange { .. })
    ));
}

#[test]
fn row_block_size_mismatch_and_ragged_events() {
    let r = BalancedRouter::new(1).unwrap();
    let e = CacheEvent::stored(None, vec![1], vec![0; 64]);
    assert_eq!(
        r.apply_event(W0, 0, &e),
        Err(Error::BlockSizeMismatch {
            engine: 64,
            router: 16
        })
    );
    let e = CacheEvent::stored(None, vec![1, 2], vec![0; 17]);
    assert!(matches!(
        r.apply_event(W0, 0, &e),
        Err(Error::InvalidEvent(_))
    ));
}

#[test]
fn row_out_of_order_duplicate_and_gapped_sequences() {
    let r = BalancedRouter::new(1).unwrap();
    let e = CacheEvent::stored(None, vec![1], vec![3; 16]);
    assert_eq!(
        r.apply_event(W0, 4, &e).unwrap().sequence,
        Sequence::InOrder
    );
    let dup = r.apply_event(W0, 4, &e).unwrap();
    assert_eq!((dup.sequence, dup.duplicate_blocks), (Sequence::InOrder, 1));
    let gap = r.apply_event(W0, 9, &CacheEvent::Cleared).unwrap();
    assert_eq!(gap.replay_from(), Some(5));
    let back = r.apply_event(W0, 1, &CacheEvent::Cleared).unwrap();
    assert!(matches!(
        back.sequence,
        Sequence::Restart {
            previous: 9,
            received: 1
        }
    ));
}

#[test]
fn row_unknown_parents_and_removals() {
    let r = BalancedRouter::new(1).unwrap();
    let e = CacheEvent::stored(Some(77), vec![1], vec![3; 16]);
    assert_eq!(r.apply_event(W0, 0, &e).unwrap().unknown_parent_blocks, 1);
    let o = r
        .apply_event(W0, 0, &CacheEvent::removed(vec![5, 6]))
        .unwrap();
    assert_eq!(o.unknown_removed_blocks, 2);
    assert_eq!(r.index().with_tree(|t| t.block_count()), 0);
}

#[cfg(feature = "vllm")]
#[test]
fn row_malformed_wire_payloads() {
    use prefix_router::sync::vllm::decode_batch;
    for payload in [
        &b""[..],
        &[0xc1][..],
        &[0x93, 0xcb][..],
        &[0xdd, 0xff, 0xff, 0xff, 0xff][..],
    ] {
        assert!(matches!(decode_batch(payload), Err(Error::Decode(_))));
    }
}

#[cfg(feature = "sim")]
#[test]
fn row_simulation_with_a_router_of_another_block_size() {
    use prefix_router::sim::{ClusterConfig, Request, Simulation};
    let config = ClusterConfig::default().with_workers(2).with_block_size(64);
    let sim = Simulation::new(vec![Request::new(0.0, vec![1; 128], 1)], config).unwrap();
    assert!(matches!(
        sim.run(&BalancedRouter::new(2).unwrap()),
        Err(Error::InvalidConfig {
            field: "block_size",
            ..
        })
    ));
    // Routers without a mirror have no block size to disagree with.
    assert!(sim.run(&RoundRobinRouter::new(2).unwrap()).is_ok());
}

#[cfg(feature = "sim")]
#[test]
fn row_traces_with_bad_lines() {
    use prefix_router::sim::parse_mooncake;
    let trace =
        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n{]\n";
    assert!(matches!(
        parse_mooncake(trace.as_bytes()),
        Err(Error::Trace { line: 2, .. })
    ));
}

#[cfg(feature = "sim")]
#[test]
fn row_simulated_fleet_settings() {
    use prefix_router::sim::{ClusterConfig, Engine, Fault, Request, Simulation};
    let config = ClusterConfig::default()
        .with_workers(2)
        .with_engine(Engine::Batched);
    for bad in [
        config.with_event_loss(2.0),
        config.with_event_delay_s(f64::NAN),
        config.with_scrape_interval_s(-1.0),
    ] {
        assert!(matches!(
            Simulation::new(Vec::new(), bad),
            Err(Error::InvalidConfig { .. })
        ));
    }
    let sim = || Simulation::new(vec![Request::new(0.0, vec![1; 64], 1)], config).unwrap();
    assert!(matches!(
        sim().run_replicas(&[]),
        Err(Error::InvalidConfig {
            field: "replicas",
            ..
        })
    ));
    assert!(matches!(
        Fault::parse_schedule("3@60"),
        Err(Error::InvalidConfig {
            field: "faults",
            ..
        })
    ));
    for bad in [Fault::new(2, 1.0, 5.0), Fault::new(0, 5.0, 1.0)] {
        assert!(matches!(
            sim().with_faults(vec![bad]),
            Err(Error::InvalidConfig {
                field: "faults",
                ..
            })
        ));
    }
    // Every worker gone: the request cannot be routed.
    let all_down = sim()
        .with_faults(vec![Fault::new(0, 0.0, 9.0), Fault::new(1, 0.0, 9.0)])
        .unwrap();
    assert!(matches!(
        all_down.run(&BalancedRouter::new(2).unwrap()),
        Err(Error::NoWorkers)
    ));
}

#[test]
fn row_replica_sync_frames_garbage_versions_and_too_many_peers() {
    let r = BalancedRouter::new(2)
        .unwrap()
        .with_replica_sync(ReplicaConfig::new(0, 1).with_max_peers(1))
        .unwrap();
    let now = Duration::ZERO;
    assert!(matches!(
        r.apply_replica_sync(&[1, 2, 3], now),
        Err(Error::Decode(_))
    ));
    let frame = |replica| {
        let mut out = Vec::new();
        replica::Frame {
            replica,
            incarnation: 1,
            seq: 0,
            open: 1,
            awaiting: 1,
            records: Vec::new(),
        }
        .encode(&mut out);
        out
    };
    let mut other = frame(1);
    other[0] = 2;
    assert!(matches!(
        r.apply_replica_sync(&other, now),
        Err(Error::ReplicaVersion { found: 2, .. })
    ));
    r.apply_replica_sync(&frame(1), now).unwrap();
    assert!(matches!(
        r.apply_replica_sync(&frame(2), now),
        Err(Error::ReplicaLimit { what: "peers", .. })
    ));
}

#[test]
fn row_replica_sync_records_skipped_and_counted() {
    let r = BalancedRouter::new(2)
        .unwrap()
        .with_replica_sync(ReplicaConfig::new(0, 1))
        .unwrap();
    let mut out = Vec::new();
    let routed = replica::Record::Routed {
        request: 1,
        endpoint: 7,
        rank: 0,
        prompt_tokens: 16,
        prefill_tokens: 16,
        output_tokens: 1,
        blocks: Vec::new(),
    };
    replica::Frame {
        replica: 1,
        incarnation: 1,
        seq: 0,
        open: 1,
        awaiting: 1,
        records: vec![routed, replica::Record::Completed { request: 1 }],
    }
    .encode(&mut out);
    let o = r.apply_replica_sync(&out, Duration::ZERO).unwrap();
    assert_eq!((o.unknown_targets, o.booked), (1, 0));
    let o = r.apply_replica_sync(&out, Duration::ZERO).unwrap();
    assert_eq!(o.duplicates, 1);
    r.drain_replica_sync(&mut out, 1 << 20);
    assert!(r.apply_replica_sync(&out, Duration::ZERO).unwrap().echo);
}

#[test]
fn row_replica_sync_off() {
    let r = BalancedRouter::new(2).unwrap();
    assert!(matches!(
        r.apply_replica_sync(&[1], Duration::ZERO),
        Err(Error::InvalidConfig {
            field: "replica_sync",
            ..
        })
    ));
}
