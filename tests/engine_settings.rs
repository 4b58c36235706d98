//! Per-worker engine settings: one mirror over workers whose engines are configured
//! differently (windows, chunk sizes, report modes) answers for each as its own engine
//! would, and a setting an engine's events contradict is counted, never mixed into another
//! worker's.

use prefix_router::{
    BalancedRouter, CacheEvent, CacheIndex, CacheSync, EngineSettings, Error, GroupKind,
    IndexConfig, Router, Tier, WorkerId,
};

const W0: WorkerId = WorkerId::new(0);
const W1: WorkerId = WorkerId::new(1);

/// `blocks` blocks of 16 tokens, distinct per `seed`.
fn tokens(seed: u32, blocks: usize) -> Vec<u32> {
    (0..blocks as u32 * 16)
        .map(|i| seed * 100_000 + i)
        .collect()
}

/// Both workers store the same 8 blocks in group 0, and their window group keeps only the
/// last `kept` blocks before block 6: each worker's hit is cut by its own window.
#[test]
fn each_worker_is_cut_by_its_own_window() {
    let index = CacheIndex::new(IndexConfig::default()).unwrap();
    index
        .set_engine_settings(
            W0,
            &EngineSettings::default().with_group(1, GroupKind::SlidingWindow { tokens: 32 }),
        )
        .unwrap();
    index
        .set_engine_settings(
            W1,
            &EngineSettings::default().with_group(1, GroupKind::SlidingWindow { tokens: 64 }),
        )
        .unwrap();
    let t = tokens(1, 8);
    let engine: Vec<u64> = (1..=8).collect();
    for w in [W0, W1] {
        index
            .apply_event(w, 0, &CacheEvent::stored(None, engine.clone(), t.clone()))
            .unwrap();
        // The window group keeps blocks 3..6 (engine 4..6) only; placeholders carry no kind.
        let kept =
            CacheEvent::stored(Some(3), engine[3..6].to_vec(), t[48..96].to_vec()).with_group(1);
        let outcome = index.apply_event(w, 0, &kept).unwrap();
        assert_eq!(outcome.settings_conflicts, 0);
    }
    // A window of 32 tokens needs 2 blocks (vLLM's cdiv(w - 1, 16)): blocks 4, 5 end a hit
    // at 6. A window of 64 needs 4: blocks 3..6 hold only 3, so nothing but a hit from the
    // root that the group held whole, and it holds no block 0.
    assert_eq!(index.cached_tokens(W0, &[], &t), 6 * 16);
    assert_eq!(index.cached_tokens(W1, &[], &t), 0);
}

/// A worker whose engine has no second group is never cut by another worker's group, even
/// after prompts are routed to it.
#[test]
fn a_plain_worker_beside_a_hybrid_one_is_not_cut() {
    let router = BalancedRouter::new(2).unwrap();
    let t = tokens(2, 4);
    let engine: Vec<u64> = (11..15).collect();
    let window = CacheEvent::stored(None, engine.clone(), t.clone())
        .with_group(1)
        .with_group_kind(GroupKind::SlidingWindow { tokens: 32 });
    router
        .apply_event(W0, 0, &CacheEvent::stored(None, engine.clone(), t.clone()))
        .unwrap();
    router.apply_event(W0, 0, &window).unwrap();
    router
        .apply_event(W1, 0, &CacheEvent::stored(None, engine.clone(), t.clone()))
        .unwrap();
    // Route another prompt to each worker: a plain worker's routed prompts join no group.
    for _ in 0..4 {
        let other = tokens(3, 4);
        let d = router
            .route(&prefix_router::RouteRequest::new(&other))
            .unwrap();
        router.complete(&d);
    }
    assert_eq!(router.index().cached_tokens(W1, &[], &t), 64);
    assert_eq!(router.index().cached_tokens(W0, &[], &t), 64);
    assert_eq!(
        router.index().engine_settings(W0).group(1),
        Some(GroupKind::SlidingWindow { tokens: 32 }),
        "worker 0's events stated its window"
    );
    assert_eq!(router.index().engine_settings(W1).group(1), None);
}

/// Placeholder chunks of 1 block on worker 0 and 2 blocks on worker 1, in one index: each
/// worker's host tier is read in its own chunks.
#[test]
fn placeholder_chunks_are_read_in_each_workers_size() {
    let index = CacheIndex::new(IndexConfig::default()).unwrap();
    index
        .set_engine_settings(W1, &EngineSettings::default().with_host_chunk_blocks(2))
        .unwrap();
    let t = tokens(4, 3);
    let engine: Vec<u64> = vec![21, 22, 23];
    for w in [W0, W1] {
        let mut seq = 0;
        let mut apply = |e: CacheEvent| {
            index.apply_event(w, seq, &e).unwrap();
            seq += 1;
        };
        apply(CacheEvent::stored(None, engine.clone(), t.clone()));
        // Worker 0 copies each block; worker 1 its chunk of blocks 1, 2 (named by 22), and
        // the third block alone is no whole chunk.
        let copies = if w == W0 { vec![21, 22, 23] } else { vec![22] };
        apply(CacheEvent::placeholder(copies, Tier::Host));
        apply(CacheEvent::removed(engine.clone()));
    }
    assert_eq!(index.cached_tokens(W0, &[], &t), 48);
    assert_eq!(index.cached_tokens(W1, &[], &t), 32);
    assert_eq!(index.engine_settings(W0).host_chunk_blocks, Some(1));
    assert_eq!(index.engine_settings(W1).host_chunk_blocks, Some(2));
}

/// A self-describing store shows its chunk: against a setting it is counted as a conflict
/// and followed, for that worker only.
#[test]
fn a_chunk_a_store_shows_overrides_a_wrong_setting_and_is_counted() {
    let index = CacheIndex::new(IndexConfig::default()).unwrap();
    let wrong = EngineSettings::default().with_host_chunk_blocks(4);
    index.set_engine_settings(W0, &wrong).unwrap();
    index.set_engine_settings(W1, &wrong).unwrap();
    let t = tokens(5, 2);
    let store = CacheEvent::stored(None, vec![31, 32], t.clone());
    index.apply_event(W0, 0, &store).unwrap();
    let host = CacheEvent::stored(None, vec![31, 32], t.clone()).with_tier(Tier::Host);
    let outcome = index.apply_event(W0, 0, &host).unwrap();
    assert_eq!(outcome.settings_conflicts, 1);
    assert_eq!(index.engine_settings(W0).host_chunk_blocks, Some(2));
    assert_eq!(
        index.engine_settings(W1).host_chunk_blocks,
        Some(4),
        "another worker keeps its own setting"
    );
    // Every store that contradicts the setting is counted.
    let again = index.apply_event(W0, 1, &host).unwrap();
    assert_eq!(again.settings_conflicts, 1);
    // A store of whole chunks of the setting is none.
    let t4 = tokens(8, 4);
    index
        .apply_event(
            W1,
            0,
            &CacheEvent::stored(None, vec![61, 62, 63, 64], t4.clone()),
        )
        .unwrap();
    let whole = CacheEvent::stored(None, vec![61, 62, 63, 64], t4).with_tier(Tier::Host);
    assert_eq!(
        index.apply_event(W1, 0, &whole).unwrap().settings_conflicts,
        0
    );
    // A restart (the seq goes back) forgets what the events showed; the setting stays.
    index.apply_event(W0, 0, &store).unwrap();
    assert_eq!(index.engine_settings(W0).host_chunk_blocks, Some(4));
}

/// A group kind an event states against the worker's setting is followed and counted.
#[test]
fn a_window_an_event_states_overrides_a_wrong_setting_and_is_counted() {
    let index = CacheIndex::new(IndexConfig::default()).unwrap();
    let set = EngineSettings::default().with_group(1, GroupKind::SlidingWindow { tokens: 128 });
    index.set_engine_settings(W0, &set).unwrap();
    let t = tokens(6, 2);
    let stated = CacheEvent::stored(None, vec![41, 42], t)
        .with_group(1)
        .with_group_kind(GroupKind::SlidingWindow { tokens: 512 });
    let outcome = index.apply_event(W0, 0, &stated).unwrap();
    assert_eq!(outcome.settings_conflicts, 1);
    assert_eq!(
        index.engine_settings(W0).group(1),
        Some(GroupKind::SlidingWindow { tokens: 512 })
    );
}

/// Full reports per worker: worker 0 reports its hits again (a store from the root of
/// blocks it holds only refreshes them), worker 1 recomputes (the same store makes second
/// copies, so one removal leaves the block held).
#[test]
fn full_reports_are_a_per_worker_setting() {
    let index = CacheIndex::new(IndexConfig::default()).unwrap();
    index
        .set_engine_settings(W0, &EngineSettings::default().with_full_reports(true))
        .unwrap();
    let t = tokens(7, 2);
    for w in [W0, W1] {
        let store = CacheEvent::stored(None, vec![51, 52], t.clone());
        index.apply_event(w, 0, &store).unwrap();
        index.apply_event(w, 1, &store).unwrap();
        index
            .apply_event(w, 2, &CacheEvent::removed(vec![52]))
            .unwrap();
    }
    assert_eq!(
        index.cached_tokens(W0, &[], &t),
        16,
        "a report made no copy"
    );
    assert_eq!(index.cached_tokens(W1, &[], &t), 32, "a copy stays held");
}

/// Bad settings are refused with a clear error; a router refuses an unknown worker.
#[test]
fn bad_settings_are_refused() {
    let index = CacheIndex::new(IndexConfig::default()).unwrap();
    for bad in [
        EngineSettings::default().with_host_chunk_blocks(0),
        EngineSettings::default().with_group(0, GroupKind::Mamba),
        EngineSettings::default().with_group(1, GroupKind::SlidingWindow { tokens: 0 }),
    ] {
        let err = index.set_engine_settings(W0, &bad).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    }
    let router = BalancedRouter::new(2).unwrap();
    let err = router
        .set_engine_settings(WorkerId::new(7), &EngineSettings::default())
        .unwrap_err();
    assert!(matches!(err, Error::UnknownWorker(_)));
    // Removing a worker forgets its settings.
    router
        .set_engine_settings(W1, &EngineSettings::default().with_host_chunk_blocks(8))
        .unwrap();
    router.remove_worker(W1).unwrap();
    router.add_worker(W1).unwrap();
    assert_eq!(
        router.index().engine_settings(W1).host_chunk_blocks,
        Some(1)
    );
}
