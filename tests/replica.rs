//! Replica sync through the public API: what one router drains, another applies; and each
//! failure mode of a bus: lost, duplicated and reordered frames, a peer that restarts or
//! goes silent, records naming unknown targets, another version, floods and garbage.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use prefix_router::replica::{Frame, Record};
use prefix_router::{
    BalancedRouter, BlockHash, CacheEvent, CacheSync, EngineLoad, Error, LoadConfig, ReplicaConfig,
    RouteDecision, RouteRequest, Router, WorkerId,
};
use proptest::prelude::*;

const WORKERS: u32 = 4;

fn replica(id: u64, incarnation: u64) -> BalancedRouter {
    BalancedRouter::new(WORKERS)
        .unwrap()
        .with_replica_sync(ReplicaConfig::new(id, incarnation))
        .unwrap()
}

fn drain(r: &dyn Router) -> Vec<u8> {
    let mut out = Vec::new();
    r.drain_replica_sync(&mut out, usize::MAX);
    out
}

fn prompt(seed: u32, blocks: u32) -> Vec<u32> {
    (0..blocks * 16).map(|i| seed * 100_000 + i).collect()
}

fn at(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Peers' requests on each worker: (in flight, prefill tokens).
fn peer_load(r: &dyn Router) -> Vec<(u64, u64)> {
    (0..WORKERS)
        .map(|w| {
            let l = r.load(WorkerId::new(w)).unwrap();
            (l.peer_in_flight, l.peer_prefill_tokens)
        })
        .collect()
}

/// A router's own requests on each worker: (in flight, prefill tokens).
fn own_load(r: &dyn Router) -> Vec<(u64, u64)> {
    (0..WORKERS)
        .map(|w| {
            let l = r.load(WorkerId::new(w)).unwrap();
            (l.in_flight, l.prefill_tokens)
        })
        .collect()
}

#[test]
fn a_peer_predicts_the_prefix_and_books_the_request_until_it_completes() {
    let (a, b) = (replica(1, 1), replica(2, 1));
    let tokens = prompt(1, 8);
    let d = a.route(&RouteRequest::new(&tokens)).unwrap();
    let w = d.worker();
    let outcome = b.apply_replica_sync(&drain(&a), at(0)).unwrap();
    assert_eq!((outcome.records, outcome.booked), (1, 1));
    assert_eq!(b.index().cached_tokens(w, &[], &tokens), 128);
    assert_eq!(b.load(w).unwrap().peer_in_flight, 1);
    assert_eq!(b.load(w).unwrap().peer_prefill_tokens, 128);
    a.first_token(&d);
    b.apply_replica_sync(&drain(&a), at(0)).unwrap();
    assert_eq!(peer_load(&b)[w.index()], (1, 0));
    // The next turn of the prefix goes where the peer sent the first, its prefill done (a
    // short answer: the peer's decode beside it costs less than recomputing elsewhere).
    let next = [&tokens[..], &prompt(2, 1)].concat();
    let e = b
        .route(&RouteRequest::new(&next).with_expected_output(1))
        .unwrap();
    assert_eq!((e.worker(), e.cached_tokens()), (w, 128));
    b.complete(&e);
    a.complete(&d);
    b.apply_replica_sync(&drain(&a), at(0)).unwrap();
    assert_eq!(peer_load(&b)[w.index()], (0, 0));
    // The prefix stays predicted: the request ran there.
    assert_eq!(b.index().cached_tokens(w, &[], &tokens), 128);
    let stats = b.replica_sync_stats().unwrap();
    assert_eq!((stats.frames_applied, stats.records_applied), (3, 3));
    assert_eq!((stats.peers, stats.bookings), (1, 0));
    assert_eq!(a.replica_sync_stats().unwrap().frames_sent, 3);
}

#[test]
fn a_replicas_own_frames_are_echoes() {
    let a = replica(1, 1);
    let d = a.route(&RouteRequest::new(&prompt(1, 4))).unwrap();
    let outcome = a.apply_replica_sync(&drain(&a), at(0)).unwrap();
    assert!(outcome.echo);
    assert_eq!(peer_load(&a)[d.worker().index()], (0, 0));
    assert_eq!(a.replica_sync_stats().unwrap().echoes, 1);
}

/// The peer's predicted blocks are the router's own kind of insert: the engine's events
/// outrank them, and a removal takes them out.
#[test]
fn an_engines_removal_takes_a_peers_prediction_out() {
    let (a, b) = (replica(1, 1), replica(2, 1));
    let tokens = prompt(1, 2);
    let d = a.route(&RouteRequest::new(&tokens)).unwrap();
    let w = d.worker();
    b.apply_replica_sync(&drain(&a), at(0)).unwrap();
    assert_eq!(b.index().cached_tokens(w, &[], &tokens), 32);
    b.apply_event(
        w,
        0,
        &CacheEvent::stored(None, vec![10, 11], tokens.clone()),
    )
    .unwrap();
    b.apply_event(w, 1, &CacheEvent::removed(vec![10, 11]))
        .unwrap();
    assert_eq!(b.index().cached_tokens(w, &[], &tokens), 0);
}

#[test]
fn a_restart_releases_the_old_incarnations_bookings_and_ignores_its_late_frames() {
    let b = replica(2, 1);
    let old = replica(1, 1);
    let d = old.route(&RouteRequest::new(&prompt(1, 4))).unwrap();
    let late = {
        old.first_token(&d);
        drain(&old)
    };
    let first = Frame::decode(&late).unwrap();
    assert_eq!(first.records.len(), 2);
    b.apply_replica_sync(&late, at(0)).unwrap();
    assert_eq!(peer_load(&b)[d.worker().index()].0, 1);
    // The same replica id starts again: its first frame releases the old bookings.
    let new = replica(1, 2);
    let outcome = b.apply_replica_sync(&drain(&new), at(1)).unwrap();
    assert!(outcome.restarted);
    assert_eq!(peer_load(&b), vec![(0, 0); 4]);
    // A frame of the old incarnation, late on the bus, is stale.
    assert!(b.apply_replica_sync(&late, at(1)).unwrap().stale);
    assert_eq!(peer_load(&b), vec![(0, 0); 4]);
    let stats = b.replica_sync_stats().unwrap();
    assert_eq!((stats.restarts, stats.stale_frames), (1, 1));
}

/// A host that gives every start the same incarnation still restarts cleanly: frame
/// numbers far below the highest heard are a restart.
#[test]
fn frame_numbers_far_back_are_a_restart() {
    let b = replica(2, 1);
    let frame = |seq, records| {
        let mut out = Vec::new();
        Frame {
            replica: 1,
            incarnation: 0,
            seq,
            open: 1,
            awaiting: 1,
            records,
        }
        .encode(&mut out);
        out
    };
    let routed = Record::Routed {
        request: 1,
        endpoint: 0,
        rank: 0,
        prompt_tokens: 32,
        prefill_tokens: 32,
        output_tokens: 8,
        blocks: Vec::new(),
    };
    b.apply_replica_sync(&frame(5_000, vec![routed.clone()]), at(0))
        .unwrap();
    assert_eq!(peer_load(&b)[0], (1, 32));
    // A few frames back: reordered, not a restart (and the record a duplicate).
    let o = b.apply_replica_sync(&frame(4_990, vec![routed.clone()]), at(0));
    assert_eq!((o.unwrap().restarted, peer_load(&b)[0]), (false, (1, 32)));
    let o = b
        .apply_replica_sync(&frame(0, vec![routed]), at(0))
        .unwrap();
    assert!(o.restarted);
    assert_eq!(
        peer_load(&b)[0],
        (1, 32),
        "the new start's request, booked once"
    );
}

#[test]
fn a_silent_peers_bookings_go_when_its_lease_runs_out() {
    let a = replica(1, 1);
    let b = BalancedRouter::new(WORKERS)
        .unwrap()
        .with_replica_sync(ReplicaConfig::new(2, 1).with_lease(Duration::from_secs(5)))
        .unwrap();
    let d = a.route(&RouteRequest::new(&prompt(1, 4))).unwrap();
    b.apply_replica_sync(&drain(&a), at(100)).unwrap();
    assert_eq!(peer_load(&b)[d.worker().index()].0, 1);
    // Within the lease: still booked.
    let own = b
        .route(&RouteRequest::new(&prompt(2, 1)).with_time(at(104)))
        .unwrap();
    assert_eq!(peer_load(&b)[d.worker().index()].0, 1);
    // Past it, the router's clock (moved by a request's time) releases them.
    let later = b
        .route(&RouteRequest::new(&prompt(3, 1)).with_time(at(106)))
        .unwrap();
    assert_eq!(peer_load(&b), vec![(0, 0); 4]);
    let stats = b.replica_sync_stats().unwrap();
    assert_eq!(
        (stats.expired_peers, stats.peers, stats.bookings),
        (1, 0, 0)
    );
    b.complete(&own);
    b.complete(&later);
}

#[test]
fn unknown_targets_other_versions_and_garbage_are_errors_counted() {
    let b = replica(2, 1);
    let mut bytes = Vec::new();
    Frame {
        replica: 1,
        incarnation: 1,
        seq: 0,
        open: 1,
        awaiting: 1,
        records: vec![Record::Routed {
            request: 1,
            endpoint: 99,
            rank: 0,
            prompt_tokens: 16,
            prefill_tokens: 16,
            output_tokens: 1,
            blocks: vec![BlockHash::new(1)],
        }],
    }
    .encode(&mut bytes);
    let outcome = b.apply_replica_sync(&bytes, at(0)).unwrap();
    assert_eq!((outcome.unknown_targets, outcome.booked), (1, 0));
    bytes[0] = 9;
    assert_eq!(
        b.apply_replica_sync(&bytes, at(0)),
        Err(Error::ReplicaVersion {
            found: 9,
            supported: 1
        })
    );
    let garbage = b.apply_replica_sync(&[1, 2, 3], at(0)).unwrap_err();
    assert!(matches!(garbage, Error::Decode(_)), "{garbage}");
    let stats = b.replica_sync_stats().unwrap();
    assert_eq!((stats.unknown_targets, stats.rejected_frames), (1, 2));
    assert_eq!(peer_load(&b), vec![(0, 0); 4]);
}

#[test]
fn routers_without_sync_say_so() {
    let plain = BalancedRouter::new(2).unwrap();
    let mut out = vec![1, 2];
    assert_eq!(plain.drain_replica_sync(&mut out, 100).records, 0);
    assert!(out.is_empty());
    let e = plain.apply_replica_sync(&[1], at(0)).unwrap_err();
    assert!(e.to_string().contains("replica_sync"), "{e}");
    assert!(plain.replica_sync_stats().is_none());
    assert!(
        ReplicaConfig::new(1, 1)
            .with_lease(Duration::ZERO)
            .validate()
            .is_err()
    );
    assert!(
        ReplicaConfig::new(1, 1)
            .with_max_peers(0)
            .validate()
            .is_err()
    );
}

#[test]
fn a_flood_stays_within_the_bounds() {
    let b = BalancedRouter::new(WORKERS)
        .unwrap()
        .with_replica_sync(
            ReplicaConfig::new(0, 1)
                .with_max_peers(4)
                .with_max_bookings_per_peer(100),
        )
        .unwrap();
    let routed = |request| Record::Routed {
        request,
        endpoint: (request % 4) as u32,
        rank: 0,
        prompt_tokens: u64::MAX,
        prefill_tokens: u64::MAX,
        output_tokens: u32::MAX,
        blocks: Vec::new(),
    };
    for replica in 1..=6u64 {
        let mut bytes = Vec::new();
        Frame {
            replica,
            incarnation: 1,
            seq: 0,
            open: 0,
            awaiting: 0,
            records: (1..=5_000).map(routed).collect(),
        }
        .encode(&mut bytes);
        let applied = b.apply_replica_sync(&bytes, at(0));
        if replica <= 4 {
            assert_eq!(applied.unwrap().booked, 5_000);
        } else {
            assert_eq!(
                applied,
                Err(Error::ReplicaLimit {
                    what: "peers",
                    limit: 4
                })
            );
        }
    }
    let stats = b.replica_sync_stats().unwrap();
    assert_eq!((stats.peers, stats.bookings), (4, 400));
    let in_flight: u64 = peer_load(&b).iter().map(|l| l.0).sum();
    assert_eq!(in_flight, 400);
    // The router still routes, and its estimates did not overflow.
    let d = b.route(&RouteRequest::new(&prompt(1, 1))).unwrap();
    assert!(b.load(d.worker()).unwrap().wait_s.is_finite());
}

/// With `replicas` 4 and no peer heard, the router's routes since a report count four
/// times; with the three others heard, once (their own requests count themselves).
#[test]
fn heard_peers_replace_the_replicas_guess() {
    let config = LoadConfig::default().with_replicas(4);
    let b = BalancedRouter::with_config(
        WORKERS,
        prefix_router::BalancedConfig::default().with_load(config),
    )
    .unwrap()
    .with_replica_sync(ReplicaConfig::new(0, 1))
    .unwrap();
    let w = WorkerId::new(0);
    let report = EngineLoad::new(0, 0, Duration::ZERO);
    b.report_load(w, report).unwrap();
    let route_to_w = |b: &BalancedRouter| -> RouteDecision {
        loop {
            let d = b.route(&RouteRequest::new(&[1, 2, 3])).unwrap();
            if d.worker() == w {
                return d;
            }
        }
    };
    let d = route_to_w(&b);
    assert_eq!(b.load(w).unwrap().estimated_requests, 4);
    for peer in 1..=3 {
        let p = replica(peer, 1);
        b.apply_replica_sync(&drain(&p), at(0)).unwrap();
    }
    b.report_load(w, report).unwrap();
    b.complete(&d);
    let d = route_to_w(&b);
    assert_eq!(b.load(w).unwrap().estimated_requests, 1);
    b.complete(&d);
}

/// One step of a sender's life.
#[derive(Clone, Debug)]
enum Op {
    Route(u32, u32),
    FirstToken(usize),
    Complete(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        (0u32..4, 1u32..6).prop_map(|(s, n)| Op::Route(s, n)),
        any::<usize>().prop_map(Op::FirstToken),
        any::<usize>().prop_map(Op::Complete),
    ];
    proptest::collection::vec(op, 1..40)
}

/// Runs `ops` on `a`, draining a frame after each; returns the frames and the decisions.
fn live(a: &BalancedRouter, ops: &[Op]) -> (Vec<Vec<u8>>, Vec<RouteDecision>) {
    let (mut frames, mut decisions) = (Vec::new(), Vec::new());
    for op in ops {
        match *op {
            Op::Route(seed, blocks) => {
                let tokens = prompt(seed, blocks);
                decisions.push(a.route(&RouteRequest::new(&tokens)).unwrap());
            }
            Op::FirstToken(i) if !decisions.is_empty() => {
                a.first_token(&decisions[i % decisions.len()]);
            }
            Op::Complete(i) if !decisions.is_empty() => {
                a.complete(&decisions[i % decisions.len()]);
            }
            _ => {}
        }
        frames.push(drain(a));
    }
    (frames, decisions)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Every frame delivered, in any order and any number of times: the receiver books
    /// exactly the sender's requests in flight, worker by worker, prefill by prefill.
    #[test]
    fn duplicated_and_reordered_frames_book_what_the_sender_has_in_flight(
        ops in ops(),
        order in proptest::collection::vec(any::<prop::sample::Index>(), 0..80),
    ) {
        let (a, b) = (replica(1, 1), replica(2, 1));
        let (frames, _decisions) = live(&a, &ops);
        // Each frame at least once, then duplicates in a scrambled order.
        let mut delivery: Vec<usize> = (0..frames.len()).collect();
        delivery.extend(order.iter().map(|i| i.index(frames.len())));
        let n = delivery.len();
        for (k, i) in order.iter().enumerate() {
            delivery.swap(k % n, i.index(n));
        }
        for &i in &delivery {
            b.apply_replica_sync(&frames[i], at(0)).unwrap();
        }
        prop_assert_eq!(peer_load(&b), own_load(&a));
    }

    /// Frames lost: once the sender has completed everything, its next frame leaves no
    /// booking behind, whatever was lost.
    #[test]
    fn lost_frames_leave_no_booking_once_the_sender_is_idle(
        ops in ops(),
        lost in proptest::collection::vec(any::<bool>(), 40),
    ) {
        let (a, b) = (replica(1, 1), replica(2, 1));
        let (frames, decisions) = live(&a, &ops);
        for (f, gone) in frames.iter().zip(&lost) {
            if !gone {
                b.apply_replica_sync(f, at(0)).unwrap();
            }
        }
        for d in &decisions {
            a.complete(d);
        }
        b.apply_replica_sync(&drain(&a), at(0)).unwrap();
        prop_assert_eq!(peer_load(&b), vec![(0, 0); 4]);
        prop_assert_eq!(b.replica_sync_stats().unwrap().bookings, 0);
    }

    /// Bytes off the bus, whatever they are, are applied or refused: never a panic, and the
    /// router routes on.
    #[test]
    fn any_bytes_are_applied_or_refused(
        ops in ops(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        noise in proptest::collection::vec(any::<u8>(), 0..80),
    ) {
        let (a, b) = (replica(1, 1), replica(2, 1));
        let (frames, _) = live(&a, &ops);
        let _ = b.apply_replica_sync(&noise, at(0));
        for f in &frames {
            let mut f = f.clone();
            for (at_byte, x) in &flips {
                let i = at_byte.index(f.len());
                f[i] ^= x;
            }
            let _ = b.apply_replica_sync(&f, at(1));
        }
        let d = b.route(&RouteRequest::new(&prompt(9, 2))).unwrap();
        b.complete(&d);
    }
}
