//! KV events from the engines into the router's mirror (feature `zmq`).
//!
//! `--kv-events PUB[,REPLAY]` names, once per `--upstream` and in the same order, the
//! engine's ZMQ event socket and, optionally, its replay socket (vLLM's
//! `--kv-events-config` `endpoint` and `replay_endpoint`, as the gateway reaches them). An
//! endpoint of several data-parallel ranks publishes each rank's events on the port plus the
//! rank, as vLLM does. Batches are applied to the rank's target in seq order: a gap is
//! filled from the replay socket (`vllm_events/zmq.rs`'s `Follower`) before the batch that
//! showed it. A socket that fails is connected again a second later. Events that contradict
//! the settings assumed of the engine (`engines.rs`) are counted for the target they were
//! applied to, and its first logged.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prefix_router::sync::vllm::{apply_batch, decode_batch};
use prefix_router::{RankLayout, WorkerId};

use super::app::Gateway;
use super::zmq::{Follower, Frame};

/// One rank's event stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Source {
    pub(crate) endpoint: u32,
    pub(crate) rank: u32,
    pub(crate) publisher: String,
    pub(crate) replay: Option<String>,
}

/// The event streams the `--kv-events` values name: one per rank of each endpoint.
///
/// # Errors
/// When the count differs from the upstreams' or an address has no port.
pub(crate) fn sources(
    values: &[String],
    layout: &RankLayout,
    endpoints: u32,
) -> Result<Vec<Source>, String> {
    if values.len() != endpoints as usize {
        return Err(format!(
            "give --kv-events once per --upstream ({endpoints}), not {} times",
            values.len()
        ));
    }
    let mut out = Vec::new();
    for (endpoint, value) in values.iter().enumerate() {
        let (publisher, replay) = match value.split_once(',') {
            Some((p, r)) => (p, Some(r)),
            None => (value.as_str(), None),
        };
        for rank in 0..layout.ranks() {
            out.push(Source {
                endpoint: endpoint as u32,
                rank,
                publisher: offset_port(publisher, rank)?,
                replay: replay.map(|r| offset_port(r, rank)).transpose()?,
            });
        }
    }
    Ok(out)
}

/// `address` (`tcp://host:port`) with its port moved up by `by`.
fn offset_port(address: &str, by: u32) -> Result<String, String> {
    let after_scheme = address.find("://").map_or(0, |i| i + 3);
    let (head, port) = address
        .rsplit_once(':')
        .filter(|(head, _)| head.len() >= after_scheme)
        .ok_or_else(|| format!("{address:?} has no port"))?;
    let port: u32 = port
        .parse()
        .map_err(|_| format!("{address:?}: the port is not a number"))?;
    if port + by > u32::from(u16::MAX) {
        return Err(format!("{address:?}: rank {by}'s port is past 65535"));
    }
    Ok(format!("{head}:{}", port + by))
}

/// Follows `source` forever, applying its batches to the router's mirror.
pub(crate) async fn follow_forever(gw: Arc<Gateway>, source: Source) {
    let Ok(target) = gw.layout().target(source.endpoint, source.rank) else {
        return;
    };
    loop {
        if let Ok(mut follower) =
            Follower::connect(&source.publisher, source.replay.clone(), "").await
        {
            while let Ok(frames) = follower.next().await {
                for frame in frames.into_iter().flatten() {
                    apply(&gw, source.endpoint, target, &frame);
                }
                if let Some(stats) = gw.target_stats(target) {
                    stats.events.replayed.store(follower.replayed, Relaxed);
                    stats.events.unfilled_gaps.store(follower.unfilled, Relaxed);
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Applies one batch of `endpoint`'s events (to the target of the rank it names), counting
/// it for `target`, the stream's own.
fn apply(gw: &Gateway, endpoint: u32, target: WorkerId, frame: &Frame) {
    let (Some(sync), Some(stats)) = (gw.router().cache_sync(), gw.target_stats(target)) else {
        return;
    };
    let counters = &stats.events;
    let Ok(batch) = decode_batch(&frame.payload) else {
        counters.rejected.fetch_add(1, Relaxed);
        return;
    };
    match apply_batch(sync, gw.layout(), endpoint, frame.seq, &batch) {
        Ok(outcome) => {
            counters.batches.fetch_add(1, Relaxed);
            if outcome.settings_conflicts > 0 {
                let rank = batch.data_parallel_rank.unwrap_or(0);
                conflicted(gw, endpoint, rank, outcome.settings_conflicts);
            }
        }
        Err(_) => {
            counters.rejected.fetch_add(1, Relaxed);
        }
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let lag_us = ((now - batch.ts) * 1e6).max(0.0) as u64;
    counters.lag_us.store(lag_us, Relaxed);
}

/// Counts `n` events of `endpoint`'s `rank` that contradicted its engine's settings, for
/// the target they were applied to; the target's first is logged.
fn conflicted(gw: &Gateway, endpoint: u32, rank: u32, n: usize) {
    let Ok(target) = gw.layout().target(endpoint, rank) else {
        return;
    };
    let Some(stats) = gw.target_stats(target) else {
        return;
    };
    let before = stats.events.settings_conflicts.fetch_add(n as u64, Relaxed);
    if before == 0 {
        eprintln!(
            "worker {} (upstream {endpoint} rank {rank}): settings conflict: its engine's KV \
             events contradict the settings assumed for upstream {endpoint} (printed at \
             start); the events are followed, and counted in /stats \
             (events.settings_conflicts)",
            target.get()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rank_listens_on_the_ports_plus_its_rank() {
        let layout = RankLayout::new(2).unwrap();
        let values = [
            "tcp://a:5557,tcp://a:5558".to_owned(),
            "tcp://b:6000".to_owned(),
        ];
        let got = sources(&values, &layout, 2).unwrap();
        let seen: Vec<(u32, u32, &str, Option<&str>)> = got
            .iter()
            .map(|s| {
                (
                    s.endpoint,
                    s.rank,
                    s.publisher.as_str(),
                    s.replay.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (0, 0, "tcp://a:5557", Some("tcp://a:5558")),
                (0, 1, "tcp://a:5558", Some("tcp://a:5559")),
                (1, 0, "tcp://b:6000", None),
                (1, 1, "tcp://b:6001", None),
            ]
        );
    }

    #[test]
    fn bad_values_are_errors() {
        let layout = RankLayout::new(2).unwrap();
        let one = |v: &str| sources(&[v.to_owned()], &layout, 1).unwrap_err();
        assert!(one("tcp://a").contains("has no port"));
        assert!(one("tcp://a:x").contains("not a number"));
        assert!(one("tcp://a:65535").contains("past 65535"));
        let e = sources(&["tcp://a:1".to_owned()], &layout, 2).unwrap_err();
        assert!(e.contains("once per --upstream (2), not 1 times"), "{e}");
    }
}
