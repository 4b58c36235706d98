//! Reading vLLM's KV-event stream from its ZMQ PUB socket (feature `zmq`, a pure-Rust ZMQ).
//!
//! vLLM publishes each event batch as a three-frame message: the topic, the batch's
//! sequence number as 8 bytes big-endian, and the msgpack payload.

use zeromq::{Socket, SocketRecv, SubSocket};

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
