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
/// reports the gap itself. A batch whose seq is below the next one expected was replayed
/// already and is skipped, except seq 0, which starts a restarted engine's stream.
pub(crate) struct Follower {
    socket: SubSocket,
    replay: Option<String>,
    /// The seq expected next; `None` before the first batch.
    next: Option<u64>,
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
        Ok(Self {
            socket,
            next: pending.last().map(|f| f.seq + 1),
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
        let expected = self.next.unwrap_or(0);
        if frame.seq < expected && frame.seq > 0 {
            return Ok(Vec::new()); // replayed already
        }
        self.next = Some(frame.seq.saturating_add(1));
        if frame.seq <= expected {
            return Ok(vec![Ok(frame)]); // in order, or a restart (seq 0)
        }
        let mut batches = self.fill(expected, frame.seq).await;
        batches.push(Ok(frame));
        Ok(batches)
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
        self.replayed += filled.len() as u64;
        if filled.len() as u64 != to - from {
            self.unfilled += 1;
        }
        filled.into_iter().map(Ok).collect()
    }
}
