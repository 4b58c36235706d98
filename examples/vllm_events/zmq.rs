//! Reading vLLM's KV-event stream from its ZMQ PUB socket (feature `zmq`, a pure-Rust ZMQ).
//!
//! vLLM publishes each event batch as a three-frame message: the topic, the batch's
//! sequence number as 8 bytes big-endian, and the msgpack payload. Its replay socket (a
//! ROUTER) answers a request naming a seq with the batches it still buffers from that seq
//! on, then an end marker (seq -1).

use zeromq::{Socket, SocketRecv, SocketSend, SubSocket};

/// One batch as it came off the socket.
pub(crate) struct Frame {
    pub(crate) seq: u64,
    pub(crate) payload: Vec<u8>,
}

/// A SUB socket connected to `endpoint` (for example `tcp://10.0.0.5:5557`), subscribed to
/// the messages whose topic starts with `topic` (`""`: all of them).
pub(crate) async fn subscribe(endpoint: &str, topic: &str) -> Result<SubSocket, String> {
    let mut socket = SubSocket::new();
    socket
        .connect(endpoint)
        .await
        .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
    socket
        .subscribe(topic)
        .await
        .map_err(|e| format!("cannot subscribe on {endpoint}: {e}"))?;
    Ok(socket)
}

/// The next message, split into its frames: `Err` for a socket error (the stream is over),
/// `Ok(Err(..))` for a message that is not `(topic, 8-byte seq, payload)` (the stream goes
/// on).
pub(crate) async fn next_frame(socket: &mut SubSocket) -> Result<Result<Frame, String>, String> {
    let message = socket.recv().await.map_err(|e| e.to_string())?;
    Ok(parse(message.into_vec()))
}

/// Splits a message's frames into a [`Frame`].
pub(crate) fn parse(frames: Vec<impl AsRef<[u8]>>) -> Result<Frame, String> {
    // The topic is the subscription's business: the socket filtered on it already.
    let [_topic, seq, payload] = frames.as_slice() else {
        return Err(format!(
            "expected 3 frames (topic, seq, payload), got {}",
            frames.len()
        ));
    };
    let seq: [u8; 8] = seq.as_ref().try_into().map_err(|_| {
        format!(
            "the seq frame has {} bytes, expected 8 (big-endian)",
            seq.as_ref().len()
        )
    })?;
    Ok(Frame {
        seq: u64::from_be_bytes(seq),
        payload: payload.as_ref().to_vec(),
    })
}

/// The seq vLLM's replay socket sends after the last replayed batch: -1 as 8 bytes.
const END_SEQ: [u8; 8] = [0xFF; 8];

/// Asks the replay socket at `endpoint` (vLLM's ROUTER socket, `replay_endpoint`) for the
/// batches it still holds from seq `from` on, and collects them until its end marker, each
/// answer within `wait`. Replies may carry the topic frame or not (vLLM releases differ).
///
/// # Errors
/// When the socket cannot be reached, does not answer in time, or answers out of shape.
pub(crate) async fn replay(
    endpoint: &str,
    from: u64,
    wait: std::time::Duration,
) -> Result<Vec<Frame>, String> {
    let mut socket = zeromq::DealerSocket::new();
    socket
        .connect(endpoint)
        .await
        .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
    let mut request = zeromq::ZmqMessage::from(Vec::<u8>::new());
    request.push_back(from.to_be_bytes().to_vec().into());
    socket
        .send(request)
        .await
        .map_err(|e| format!("cannot ask {endpoint} for a replay: {e}"))?;
    let mut frames = Vec::new();
    loop {
        let message = tokio::time::timeout(wait, socket.recv())
            .await
            .map_err(|_| format!("{endpoint} did not answer the replay request in time"))?
            .map_err(|e| e.to_string())?;
        let mut parts: Vec<_> = message.into_vec();
        // The DEALER keeps the empty delimiter the ROUTER put before the reply.
        if parts.first().is_some_and(|p| p.is_empty()) {
            parts.remove(0);
        }
        if parts.len() == 2 {
            parts.insert(0, Vec::new().into());
        }
        if parts.get(1).is_some_and(|seq| seq.as_ref() == END_SEQ) {
            return Ok(frames);
        }
        frames.push(parse(parts)?);
    }
}

/// An engine's event stream in seq order: a subscription whose gaps are filled from the
/// engine's replay socket, when there is one.
///
/// On connecting, the batches the replay socket holds come first (a subscriber misses what
/// was published before it joined). A gap is a batch whose seq is past the next one
/// expected: the batches the replay socket still holds between the two come first, then the
/// batch that showed the gap. A gap the replay cannot fill (no replay socket, no answer, or
/// batches gone from its buffer) is counted and the stream goes on: the mirror sees and
/// reports the gap itself. Batches already returned are skipped (see [`Order`]).
pub(crate) struct Follower {
    socket: SubSocket,
    replay: Option<String>,
    order: Order,
    /// Replayed batches not returned yet.
    pending: Vec<Frame>,
    /// Batches received from the replay socket.
    pub(crate) replayed: u64,
    /// Gaps the replay did not fill.
    pub(crate) unfilled: u64,
}

impl Follower {
    /// Subscribes to `endpoint` for `topic`, filling gaps from `replay`.
    ///
    /// # Errors
    /// When the socket cannot connect or subscribe.
    pub(crate) async fn connect(
        endpoint: &str,
        replay: Option<String>,
        topic: &str,
    ) -> Result<Self, String> {
        let socket = subscribe(endpoint, topic).await?;
        let pending = match &replay {
            Some(r) => self::replay(r, 0, std::time::Duration::from_secs(2))
                .await
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let mut order = Order::default();
        for frame in &pending {
            order.place(frame);
        }
        Ok(Self {
            socket,
            order,
            replayed: pending.len() as u64,
            pending,
            replay,
            unfilled: 0,
        })
    }

    /// The next batches in seq order: usually one, more when a gap was filled; an `Err`
    /// item for a message out of shape. `Err` when the socket fails (the stream is over).
    pub(crate) async fn next(&mut self) -> Result<Vec<Result<Frame, String>>, String> {
        if !self.pending.is_empty() {
            return Ok(std::mem::take(&mut self.pending)
                .into_iter()
                .map(Ok)
                .collect());
        }
        let frame = match next_frame(&mut self.socket).await? {
            Ok(frame) => frame,
            Err(e) => return Ok(vec![Err(e)]),
        };
        match self.order.place(&frame) {
            Place::Seen => Ok(Vec::new()),
            Place::Next => Ok(vec![Ok(frame)]),
            Place::After(from) => {
                let mut batches = self.fill(from, frame.seq).await;
                batches.push(Ok(frame));
                Ok(batches)
            }
        }
    }

    /// The batches `from..to` from the replay socket, counting the gap unfilled when they
    /// do not all come.
    async fn fill(&mut self, from: u64, to: u64) -> Vec<Result<Frame, String>> {
        let replayed = match &self.replay {
            Some(endpoint) => replay(endpoint, from, std::time::Duration::from_secs(2))
                .await
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let filled: Vec<Frame> = replayed
            .into_iter()
            .filter(|f| (from..to).contains(&f.seq))
            .collect();
        for frame in &filled {
            self.order.filled(frame);
        }
        self.replayed += filled.len() as u64;
        if filled.len() as u64 != to - from {
            self.unfilled += 1;
        }
        filled.into_iter().map(Ok).collect()
    }
}

/// Where a batch falls in its stream.
#[derive(Debug, PartialEq, Eq)]
enum Place {
    /// Returned already (it came from the replay socket, then from the subscription too).
    Seen,
    /// The next one expected, or the first of a restarted engine's stream.
    Next,
    /// Past the next one expected, which is this seq: the batches between are missing.
    After(u64),
}

/// The seq order of one engine's stream.
///
/// A seq below the next one expected was returned already, except seq 0: that starts a
/// restarted engine's stream, unless its payload is the one seq 0 already returned carried
/// (the same batch, from the replay socket and the subscription both: vLLM's payloads carry
/// a timestamp, so a restarted engine's first batch differs).
#[derive(Default)]
struct Order {
    /// The seq expected next; `None` before the first batch.
    next: Option<u64>,
    /// The payload of the current stream's seq 0, once seen.
    first: Option<Vec<u8>>,
}

impl Order {
    /// Where `frame` falls; unless it was seen, the stream moves past it.
    fn place(&mut self, frame: &Frame) -> Place {
        let expected = self.next.unwrap_or(0);
        if frame.seq == 0 && self.first.as_deref() == Some(frame.payload.as_slice()) {
            return Place::Seen;
        }
        if frame.seq < expected && frame.seq > 0 {
            return Place::Seen;
        }
        if frame.seq == 0 {
            self.first = Some(frame.payload.clone());
        }
        self.next = Some(frame.seq.saturating_add(1));
        if frame.seq <= expected {
            Place::Next
        } else {
            Place::After(expected)
        }
    }

    /// Notes `frame`, one of the batches a gap was filled with (the stream is past it).
    fn filled(&mut self, frame: &Frame) {
        if frame.seq == 0 {
            self.first = Some(frame.payload.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(seq: u64, payload: &[u8]) -> Frame {
        Frame {
            seq,
            payload: payload.to_vec(),
        }
    }

    #[test]
    fn a_batch_from_both_the_replay_and_the_subscription_is_returned_once() {
        let mut order = Order::default();
        assert_eq!(order.place(&frame(0, b"a")), Place::Next);
        assert_eq!(order.place(&frame(1, b"b")), Place::Next);
        assert_eq!(order.place(&frame(0, b"a")), Place::Seen);
        assert_eq!(order.place(&frame(1, b"b")), Place::Seen);
        assert_eq!(order.place(&frame(2, b"c")), Place::Next);
    }

    #[test]
    fn a_restarted_engines_first_batch_starts_a_new_stream() {
        let mut order = Order::default();
        assert_eq!(order.place(&frame(0, b"a")), Place::Next);
        assert_eq!(order.place(&frame(1, b"b")), Place::Next);
        assert_eq!(order.place(&frame(0, b"z")), Place::Next);
        assert_eq!(order.place(&frame(1, b"y")), Place::Next);
        assert_eq!(order.place(&frame(0, b"z")), Place::Seen);
    }

    #[test]
    fn a_seq_past_the_next_one_shows_where_the_gap_starts() {
        let mut order = Order::default();
        assert_eq!(order.place(&frame(3, b"d")), Place::After(0));
        assert_eq!(order.place(&frame(4, b"e")), Place::Next);
        assert_eq!(order.place(&frame(7, b"h")), Place::After(5));
        order.filled(&frame(0, b"a"));
        assert_eq!(order.place(&frame(0, b"a")), Place::Seen);
        assert_eq!(order.place(&frame(8, b"i")), Place::Next);
    }
}
