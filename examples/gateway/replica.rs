//! Replica sync over NATS (`--nats URL`): several gateways in front of the same workers
//! tell each other what they routed, so that each predicts the prefixes its peers just sent
//! and counts their requests in the workers' load.
//!
//! Every `--sync-interval-ms` (default 5) the gateway drains its router's records into a
//! frame and publishes it on `--nats-subject`; with nothing to say it publishes an empty
//! frame (a heartbeat) every third of the lease. It applies every frame on the subject,
//! its own echoes included (the router ignores them, and their times keep its clock
//! moving). NATS core is best effort: while the server is away the client buffers a little
//! and then publishing times out, frames are dropped and counted, and each gateway routes
//! on its own (engine events and load reports go on); the client reconnects every 100 ms
//! and sync resumes. No request waits on NATS.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use futures_util::StreamExt;
use serde_json::{Value, json};

use super::app::Gateway;

/// A frame's bytes at most (NATS's default payload limit).
const MAX_FRAME: usize = 1 << 20;

/// How long a publish may wait for the client's buffer before its frame is dropped.
const PUBLISH_WAIT: Duration = Duration::from_millis(200);

/// Where and how often to sync.
#[derive(Clone, Debug)]
pub(crate) struct SyncOptions {
    pub(crate) url: String,
    pub(crate) subject: String,
    /// Time between two drains.
    pub(crate) interval: Duration,
    /// Time between two heartbeats when there is nothing to say.
    pub(crate) heartbeat: Duration,
}

/// What the sync tasks count, for `/stats`.
#[derive(Debug, Default)]
pub(crate) struct SyncStatus {
    pub(crate) connected: AtomicBool,
    pub(crate) published: AtomicU64,
    /// Frames dropped: the server away too long, or the client closed.
    pub(crate) dropped: AtomicU64,
    pub(crate) received: AtomicU64,
    /// Frames the router refused (another version, garbage, too many peers).
    pub(crate) refused: AtomicU64,
}

impl SyncStatus {
    /// The counters and the router's sync figures, as JSON.
    pub(crate) fn json(&self, gw: &Gateway) -> Value {
        let router = gw.router().replica_sync_stats();
        json!({
            "connected": self.connected.load(Relaxed),
            "published": self.published.load(Relaxed),
            "dropped": self.dropped.load(Relaxed),
            "received": self.received.load(Relaxed),
            "refused": self.refused.load(Relaxed),
            "peers": router.map(|s| s.peers),
            "bookings": router.map(|s| s.bookings),
            "frames_applied": router.map(|s| s.frames_applied),
            "missed_frames": router.map(|s| s.missed_frames),
            "expired_peers": router.map(|s| s.expired_peers),
            "bytes_sent": router.map(|s| s.bytes_sent),
        })
    }
}

/// Connects to NATS (in the background: a server that is not there yet is retried) and
/// starts publishing the router's frames and applying the peers'.
///
/// # Errors
/// When the URL or subject is not one NATS takes.
pub(crate) async fn start(gw: Arc<Gateway>, options: SyncOptions) -> Result<(), String> {
    let status = Arc::clone(gw.sync_status());
    let on_event = Arc::clone(&status);
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .reconnect_delay_callback(|_| Duration::from_millis(100))
        .event_callback(move |event| {
            let on_event = Arc::clone(&on_event);
            async move {
                match event {
                    async_nats::Event::Connected => on_event.connected.store(true, Relaxed),
                    async_nats::Event::Disconnected | async_nats::Event::Closed => {
                        on_event.connected.store(false, Relaxed);
                    }
                    _ => {}
                }
            }
        })
        .connect(options.url.as_str())
        .await
        .map_err(|e| format!("--nats {}: {e}", options.url))?;
    let subscriber = client
        .subscribe(options.subject.clone())
        .await
        .map_err(|e| format!("--nats-subject {}: {e}", options.subject))?;
    tokio::spawn(apply_forever(Arc::clone(&gw), subscriber));
    tokio::spawn(publish_forever(gw, client, options));
    Ok(())
}

/// Applies every frame on the subject to the router.
async fn apply_forever(gw: Arc<Gateway>, mut subscriber: async_nats::Subscriber) {
    while let Some(message) = subscriber.next().await {
        let status = gw.sync_status();
        match gw.router().apply_replica_sync(&message.payload, gw.clock()) {
            Ok(_) => status.received.fetch_add(1, Relaxed),
            Err(_) => status.refused.fetch_add(1, Relaxed),
        };
    }
}

/// Drains and publishes the router's frames every interval, a heartbeat when due.
async fn publish_forever(gw: Arc<Gateway>, client: async_nats::Client, options: SyncOptions) {
    let mut tick = tokio::time::interval(options.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Instant::now();
    let mut frame = Vec::new();
    loop {
        tick.tick().await;
        loop {
            let drained = gw.router().drain_replica_sync(&mut frame, MAX_FRAME);
            if frame.is_empty() || (drained.records == 0 && last.elapsed() < options.heartbeat) {
                break;
            }
            last = Instant::now();
            let payload = Bytes::copy_from_slice(&frame);
            let sent = tokio::time::timeout(
                PUBLISH_WAIT,
                client.publish(options.subject.clone(), payload),
            )
            .await;
            let counter = match sent {
                Ok(Ok(())) => &gw.sync_status().published,
                _ => &gw.sync_status().dropped,
            };
            counter.fetch_add(1, Relaxed);
            if !drained.more {
                break;
            }
        }
    }
}
