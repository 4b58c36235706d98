//! The mock worker's KV events (feature `zmq`), published as vLLM publishes them: per rank,
//! a PUB socket sending `(topic "kv", seq, payload)` and a ROUTER replay socket serving the
//! batches it still buffers (the last 10,000). Each served request makes one batch of
//! msgpack positional events (`BlockStored` with token IDs and block size 16, `BlockRemoved`,
//! both on medium `GPU`), stamped with the wall clock as vLLM stamps `ts`.
//!
//! A request's `mock_drop_events: true` (the mock's only) keeps its batch off the PUB
//! socket, though the replay buffer has it, so that tests can make a gap.

use std::collections::VecDeque;

use rmpv::Value as Msg;
use tokio::sync::mpsc;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::mock_cache::Change;

/// How many batches the replay socket keeps (vLLM's default `buffer_steps`).
const BUFFER: usize = 10_000;

/// A batch for one rank's publisher: its payload, and whether to keep it off the PUB socket.
struct Outgoing {
    payload: Vec<u8>,
    dropped: bool,
}

/// Where each rank publishes, and the channels to its publisher.
pub(crate) struct Publishers {
    ranks: Vec<mpsc::UnboundedSender<Outgoing>>,
    /// Per rank: the PUB endpoint and the replay endpoint, as bound.
    pub(crate) endpoints: Vec<(String, String)>,
}

impl Publishers {
    /// Binds a PUB and a replay socket per rank on `host` (ports chosen by the system) and
    /// starts their publishers on the current runtime.
    ///
    /// # Errors
    /// When a socket cannot bind.
    pub(crate) async fn bind(host: &str, ranks: u32) -> Result<Self, String> {
        let mut out = Self {
            ranks: Vec::new(),
            endpoints: Vec::new(),
        };
        for _ in 0..ranks.max(1) {
            let mut publisher = zeromq::PubSocket::new();
            let mut replay = zeromq::RouterSocket::new();
            let bind = format!("tcp://{host}:0");
            let at = publisher.bind(&bind).await.map_err(|e| e.to_string())?;
            let replay_at = replay.bind(&bind).await.map_err(|e| e.to_string())?;
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(publish(rx, publisher, replay));
            out.ranks.push(tx);
            out.endpoints.push((at.to_string(), replay_at.to_string()));
        }
        Ok(out)
    }

    /// Publishes `changes` of `rank`'s cache as one batch (none when there are none).
    pub(crate) fn send(&self, rank: u32, changes: &[Change], dropped: bool) {
        if changes.is_empty() {
            return;
        }
        if let Some(tx) = self.ranks.get(rank as usize) {
            let payload = encode(changes, rank);
            let _ = tx.send(Outgoing { payload, dropped });
        }
    }
}

/// One rank's publisher: numbers batches from 0, publishes them, keeps the last
/// [`BUFFER`] for replay, and answers replay requests, until the mock stops.
async fn publish(
    mut batches: mpsc::UnboundedReceiver<Outgoing>,
    mut publisher: zeromq::PubSocket,
    mut replay: zeromq::RouterSocket,
) {
    let mut buffer: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
    let mut seq = 0u64;
    loop {
        tokio::select! {
            batch = batches.recv() => {
                let Some(batch) = batch else { return };
                if !batch.dropped {
                    let _ = publisher.send(frames(&[b"kv", &seq.to_be_bytes(), &batch.payload])).await;
                }
                if buffer.len() == BUFFER {
                    buffer.pop_front();
                }
                buffer.push_back((seq, batch.payload));
                seq += 1;
            }
            request = replay.recv() => {
                let Ok(request) = request else { return };
                serve_replay(&mut replay, &buffer, request.into_vec()).await;
            }
        }
    }
}

/// Answers one replay request `[identity, "", start seq]` as vLLM does: every buffered
/// batch from that seq as `[identity, "", seq, payload]`, then `[identity, "", -1, ""]`.
async fn serve_replay(
    replay: &mut zeromq::RouterSocket,
    buffer: &VecDeque<(u64, Vec<u8>)>,
    request: Vec<impl AsRef<[u8]>>,
) {
    let [identity, _, start] = request.as_slice() else {
        return;
    };
    let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
        return;
    };
    let start = u64::from_be_bytes(start);
    for (seq, payload) in buffer.iter().filter(|(seq, _)| *seq >= start) {
        let reply = frames(&[identity.as_ref(), b"", &seq.to_be_bytes(), payload]);
        if replay.send(reply).await.is_err() {
            return;
        }
    }
    let _ = replay
        .send(frames(&[identity.as_ref(), b"", &[0xFF; 8], b""]))
        .await;
}

fn frames(parts: &[&[u8]]) -> ZmqMessage {
    let mut message = ZmqMessage::from(parts[0].to_vec());
    for part in &parts[1..] {
        message.push_back(part.to_vec().into());
    }
    message
}

/// A vLLM `KVEventBatch` in the positional encoding: `[ts, events, data_parallel_rank]`.
fn encode(changes: &[Change], rank: u32) -> Vec<u8> {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let events = changes.iter().map(event).collect();
    let batch = Msg::Array(vec![Msg::from(ts), Msg::Array(events), Msg::from(rank)]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).unwrap_or_else(|_| unreachable!("Vec writes"));
    out
}

fn event(change: &Change) -> Msg {
    let hashes = |hs: &[u64]| Msg::Array(hs.iter().map(|&h| Msg::from(h)).collect());
    match change {
        Change::Stored {
            parent,
            hashes: hs,
            tokens,
        } => Msg::Array(vec![
            Msg::from("BlockStored"),
            hashes(hs),
            parent.map_or(Msg::Nil, Msg::from),
            Msg::Array(tokens.iter().map(|&t| Msg::from(t)).collect()),
            Msg::from(16),
            Msg::Nil,
            Msg::from("GPU"),
        ]),
        Change::Removed(hs) => Msg::Array(vec![
            Msg::from("BlockRemoved"),
            hashes(hs),
            Msg::from("GPU"),
        ]),
    }
}
