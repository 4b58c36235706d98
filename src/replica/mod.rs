//! Replica sync: what one router replica routed, as records its peers apply, so that a
//! replica predicts a prefix its peer just routed before the engine's events say it is
//! stored, and counts its peer's requests in each worker's load.
//!
//! The crate encodes and applies records; it opens no socket. A host drains its router's
//! records into frames ([`Router::drain_replica_sync`](crate::Router::drain_replica_sync)),
//! publishes them on a bus every replica subscribes to (NATS core, as Dynamo's replica sync
//! does), and hands every frame it receives to
//! [`Router::apply_replica_sync`](crate::Router::apply_replica_sync). Delivery may lose,
//! duplicate and reorder frames: applying is idempotent, and what a lost record leaves
//! behind is bounded by the frames' watermarks and the peer's lease (see
//! [`ReplicaConfig`]).
//!
//! # Records
//!
//! A replica numbers its requests from 1 (per incarnation) and says of each:
//! - **routed**: the target as (endpoint, data-parallel rank) of the
//!   [`RankLayout`](crate::RankLayout), the prompt's chained [`BlockHash`](crate::BlockHash)es
//!   (replicas share the hasher's configuration), its prompt tokens, the tokens it expects
//!   the worker to prefill (uncached) and the output tokens it expects;
//! - **first token**: its prefill is done;
//! - **completed**: it left the worker.
//!
//! Every frame also carries two watermarks: the sender's oldest request still open, and its
//! oldest request still waiting for its first token. A peer's booking older than the first
//! is complete, and older than the second is prefilled, whatever records were lost.
//!
//! # Frame layout, version 1
//!
//! Integers marked `u64` are 8 bytes little-endian; `var` is an unsigned LEB128 varint
//! (7 bits a byte, low bits first, at most 10 bytes).
//!
//! | field | encoding | meaning |
//! |---|---|---|
//! | version | 1 byte | [`VERSION`] (1); a peer refuses another |
//! | replica | `u64` | the sender's [`ReplicaConfig::replica`] |
//! | incarnation | `u64` | the sender's [`ReplicaConfig::incarnation`]: a higher one is a restart |
//! | seq | `u64` | frame number within the incarnation, from 0 (a frame without records, a heartbeat, takes the next frame's number without using it up) |
//! | open | `var` | the sender's oldest open request (its next id when none is open) |
//! | awaiting | `var` | its oldest request without a first token (likewise) |
//! | count | `var` | records that follow, at most [`MAX_RECORDS`] |
//! | records | | `count` records, each a kind byte then its fields |
//!
//! | kind | byte | fields |
//! |---|---|---|
//! | routed | 1 | `var` request, `var` endpoint, `var` rank, `var` prompt tokens, `var` prefill tokens (≤ prompt), `var` output tokens, `var` block count (≤ [`MAX_BLOCKS`]), then each block hash as `u64` |
//! | first token | 2 | `var` request |
//! | completed | 3 | `var` request |
//!
//! A routed record costs about 10 bytes plus 8 per prompt block; the others 2 to 4 bytes;
//! a frame's header 28 to 55 (under 40 in practice). Trailing bytes, a truncated field, an
//! unknown kind, a varint past 64 bits or a count past its bound make the frame an
//! [`Error::Decode`]; another version an [`Error::ReplicaVersion`]. Nothing of a refused
//! frame is applied.
//!
//! [`Error::Decode`]: crate::Error::Decode
//! [`Error::ReplicaVersion`]: crate::Error::ReplicaVersion

mod config;
mod outbox;
mod wire;

pub use self::config::{Drained, ReplicaConfig, ReplicaOutcome, ReplicaStats};
pub use self::wire::{Frame, MAX_BLOCKS, MAX_RECORDS, Record, VERSION};

pub(crate) use self::outbox::Outbox;
pub(crate) use self::wire::{FrameView, RecordView};
