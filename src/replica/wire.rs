//! The frame codec (layout in the module docs): [`Frame`] and [`Record`] owned, for hosts
//! and tests; [`FrameView`] and [`RecordView`] borrowed, checked whole before anything is
//! applied, for the router's apply path (no allocation per record).

use crate::error::Error;
use crate::hash::BlockHash;

/// The layout version this crate writes and reads.
pub const VERSION: u8 = 1;

/// Records a frame holds at most.
pub const MAX_RECORDS: usize = 65_536;

/// Block hashes a routed record holds at most (16M tokens at 16 tokens per block).
pub const MAX_BLOCKS: usize = 1 << 20;

/// Bytes of the fixed part of the header: version, replica, incarnation, seq.
pub(crate) const FIXED_HEADER: usize = 1 + 8 + 8 + 8;

const ROUTED: u8 = 1;
const FIRST_TOKEN: u8 = 2;
const COMPLETED: u8 = 3;

/// One record of a [`Frame`] (see the module docs for what each says).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Record {
    /// The sender routed request `request` to rank `rank` of endpoint `endpoint`.
    Routed {
        /// The sender's request number (from 1, per incarnation).
        request: u64,
        /// The target's endpoint ([`RankLayout::endpoint`](crate::RankLayout::endpoint)).
        endpoint: u32,
        /// The target's data-parallel rank.
        rank: u32,
        /// Tokens in the prompt.
        prompt_tokens: u64,
        /// Of those, the tokens the sender expects the worker to prefill (not cached).
        prefill_tokens: u64,
        /// Output tokens the sender expects.
        output_tokens: u32,
        /// The prompt's full blocks, chained, as the sender's hasher hashed them (empty
        /// when its policy reads no cache).
        blocks: Vec<BlockHash>,
    },
    /// Request `request`'s first token came: its prefill is done.
    FirstToken {
        /// The sender's request number.
        request: u64,
    },
    /// Request `request` left its worker.
    Completed {
        /// The sender's request number.
        request: u64,
    },
}

/// One frame: a replica's header and its records, owned.
///
/// ```
/// use prefix_router::replica::{Frame, Record};
/// use prefix_router::BlockHash;
///
/// let frame = Frame {
///     replica: 7,
///     incarnation: 1,
///     seq: 0,
///     open: 1,
///     awaiting: 1,
///     records: vec![Record::Routed {
///         request: 1,
///         endpoint: 2,
///         rank: 0,
///         prompt_tokens: 40,
///         prefill_tokens: 40,
///         output_tokens: 16,
///         blocks: vec![BlockHash::new(11), BlockHash::new(12)],
///     }],
/// };
/// let mut bytes = Vec::new();
/// frame.encode(&mut bytes);
/// assert_eq!(bytes[0], 1); // the version
/// assert_eq!(Frame::decode(&bytes)?, frame);
/// # Ok::<(), prefix_router::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The sender's replica id.
    pub replica: u64,
    /// The sender's incarnation.
    pub incarnation: u64,
    /// The frame's number within the incarnation.
    pub seq: u64,
    /// The sender's oldest open request (its next number when none is open).
    pub open: u64,
    /// The sender's oldest request still waiting for its first token (likewise).
    pub awaiting: u64,
    /// The records.
    pub records: Vec<Record>,
}

impl Frame {
    /// Appends the frame's bytes to `out`. Records beyond [`MAX_RECORDS`] and blocks
    /// beyond [`MAX_BLOCKS`] are not written (the count says what was).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let records = &self.records[..self.records.len().min(MAX_RECORDS)];
        let header = Header {
            replica: self.replica,
            incarnation: self.incarnation,
            seq: self.seq,
            open: self.open,
            awaiting: self.awaiting,
        };
        header.write(records.len(), out);
        for r in records {
            match r {
                Record::Routed {
                    request,
                    endpoint,
                    rank,
                    prompt_tokens,
                    prefill_tokens,
                    output_tokens,
                    blocks,
                } => {
                    let shape = Shape {
                        endpoint: *endpoint,
                        rank: *rank,
                        prompt: *prompt_tokens,
                        prefill: *prefill_tokens,
                        output: *output_tokens,
                    };
                    write_routed(
                        out,
                        *request,
                        shape,
                        &blocks[..blocks.len().min(MAX_BLOCKS)],
                    );
                }
                Record::FirstToken { request } => write_mark(out, FIRST_TOKEN, *request),
                Record::Completed { request } => write_mark(out, COMPLETED, *request),
            }
        }
    }

    /// Decodes one frame.
    ///
    /// # Errors
    ///
    /// [`Error::ReplicaVersion`] for another version; [`Error::Decode`] for bytes that are
    /// not one whole frame.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let view = FrameView::parse(bytes)?;
        let h = view.header;
        let records = view
            .records()
            .map(|r| match r {
                RecordView::Routed {
                    request,
                    shape,
                    blocks,
                } => Record::Routed {
                    request,
                    endpoint: shape.endpoint,
                    rank: shape.rank,
                    prompt_tokens: shape.prompt,
                    prefill_tokens: shape.prefill,
                    output_tokens: shape.output,
                    blocks: blocks.collect(),
                },
                RecordView::FirstToken { request } => Record::FirstToken { request },
                RecordView::Completed { request } => Record::Completed { request },
            })
            .collect();
        Ok(Self {
            replica: h.replica,
            incarnation: h.incarnation,
            seq: h.seq,
            open: h.open,
            awaiting: h.awaiting,
            records,
        })
    }
}

/// A frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) replica: u64,
    pub(crate) incarnation: u64,
    pub(crate) seq: u64,
    pub(crate) open: u64,
    pub(crate) awaiting: u64,
}

impl Header {
    /// Appends the header of a frame of `records` records to `out`.
    pub(crate) fn write(&self, records: usize, out: &mut Vec<u8>) {
        out.push(VERSION);
        out.extend_from_slice(&self.replica.to_le_bytes());
        out.extend_from_slice(&self.incarnation.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        write_var(out, self.open);
        write_var(out, self.awaiting);
        write_var(out, records as u64);
    }
}

/// What a routed record says of its request, beside its number and blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) endpoint: u32,
    pub(crate) rank: u32,
    pub(crate) prompt: u64,
    pub(crate) prefill: u64,
    pub(crate) output: u32,
}

/// Appends a routed record.
pub(crate) fn write_routed(out: &mut Vec<u8>, request: u64, s: Shape, blocks: &[BlockHash]) {
    out.push(ROUTED);
    for v in [
        request,
        u64::from(s.endpoint),
        u64::from(s.rank),
        s.prompt,
        s.prefill.min(s.prompt),
        u64::from(s.output),
        blocks.len() as u64,
    ] {
        write_var(out, v);
    }
    for b in blocks {
        out.extend_from_slice(&b.get().to_le_bytes());
    }
}

/// Appends a first-token (`FIRST_TOKEN`) or completion (`COMPLETED`) record.
pub(crate) fn write_mark_first(out: &mut Vec<u8>, request: u64) {
    write_mark(out, FIRST_TOKEN, request);
}

/// Appends a completion record.
pub(crate) fn write_mark_completed(out: &mut Vec<u8>, request: u64) {
    write_mark(out, COMPLETED, request);
}

fn write_mark(out: &mut Vec<u8>, kind: u8, request: u64) {
    out.push(kind);
    write_var(out, request);
}

/// Appends `v` as an unsigned LEB128 varint.
fn write_var(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A frame checked whole: its header and its records' bytes.
///
/// Invariant: `body` holds exactly `count` well-formed records, so iterating them cannot
/// fail.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FrameView<'a> {
    pub(crate) header: Header,
    count: usize,
    body: &'a [u8],
}

/// One record of a [`FrameView`].
#[derive(Clone, Debug)]
pub(crate) enum RecordView<'a> {
    Routed {
        request: u64,
        shape: Shape,
        blocks: Blocks<'a>,
    },
    FirstToken {
        request: u64,
    },
    Completed {
        request: u64,
    },
}

/// A routed record's block hashes, read from its bytes.
#[derive(Clone, Debug)]
pub(crate) struct Blocks<'a>(core::slice::ChunksExact<'a, u8>);

impl Iterator for Blocks<'_> {
    type Item = BlockHash;

    fn next(&mut self) -> Option<BlockHash> {
        let chunk = self.0.next()?;
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        Some(BlockHash::new(u64::from_le_bytes(b)))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl ExactSizeIterator for Blocks<'_> {}

impl<'a> FrameView<'a> {
    /// Checks `bytes` as one whole frame.
    ///
    /// # Errors
    ///
    /// As [`Frame::decode`].
    pub(crate) fn parse(bytes: &'a [u8]) -> Result<Self, Error> {
        let mut r = Reader(bytes);
        let version = r.byte("version")?;
        if version != VERSION {
            return Err(Error::ReplicaVersion {
                found: version,
                supported: VERSION,
            });
        }
        let header = Header {
            replica: r.u64("replica")?,
            incarnation: r.u64("incarnation")?,
            seq: r.u64("seq")?,
            open: r.var("open")?,
            awaiting: r.var("awaiting")?,
        };
        let count = r.var("record count")?;
        // Every record takes at least 2 bytes: a count beyond that is a lie.
        if count > MAX_RECORDS as u64 || count > r.0.len() as u64 / 2 {
            return Err(decode(format!(
                "{count} records in {} bytes (at most {MAX_RECORDS})",
                r.0.len()
            )));
        }
        let body = r.0;
        for _ in 0..count {
            r.record()?;
        }
        if !r.0.is_empty() {
            return Err(decode(format!("{} bytes after the last record", r.0.len())));
        }
        Ok(Self {
            header,
            count: count as usize,
            body,
        })
    }

    /// The records, in order.
    pub(crate) fn records(&self) -> impl Iterator<Item = RecordView<'a>> + use<'a> {
        let mut r = Reader(self.body);
        // Checked by `parse`: every record reads.
        (0..self.count).map_while(move |_| r.record().ok())
    }

    /// How many records the frame holds.
    pub(crate) fn len(&self) -> usize {
        self.count
    }
}

/// Reads fields off the front of a byte slice.
struct Reader<'a>(&'a [u8]);

fn decode(message: String) -> Error {
    Error::Decode(format!("replica sync frame: {message}"))
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], Error> {
        if self.0.len() < n {
            return Err(decode(format!(
                "truncated {field}: {n} bytes wanted, {} left",
                self.0.len()
            )));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn byte(&mut self, field: &str) -> Result<u8, Error> {
        Ok(self.take(1, field)?[0])
    }

    fn u64(&mut self, field: &str) -> Result<u64, Error> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8, field)?);
        Ok(u64::from_le_bytes(b))
    }

    fn var(&mut self, field: &str) -> Result<u64, Error> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte(field)?;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && bits > 1 {
                break;
            }
            v |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(decode(format!("{field}: a varint past 64 bits")))
    }

    fn var_u32(&mut self, field: &str) -> Result<u32, Error> {
        let v = self.var(field)?;
        u32::try_from(v).map_err(|_| decode(format!("{field} {v} is past 32 bits")))
    }

    /// Reads one record.
    fn record(&mut self) -> Result<RecordView<'a>, Error> {
        let kind = self.byte("record kind")?;
        let request = self.var("request")?;
        match kind {
            ROUTED => {
                let shape = Shape {
                    endpoint: self.var_u32("endpoint")?,
                    rank: self.var_u32("rank")?,
                    prompt: self.var("prompt tokens")?,
                    prefill: self.var("prefill tokens")?,
                    output: self.var_u32("output tokens")?,
                };
                if shape.prefill > shape.prompt {
                    return Err(decode(format!(
                        "{} prefill tokens of a {}-token prompt",
                        shape.prefill, shape.prompt
                    )));
                }
                let n = self.var("block count")?;
                if n > MAX_BLOCKS as u64 {
                    return Err(decode(format!("{n} blocks (at most {MAX_BLOCKS})")));
                }
                let bytes = self.take(n as usize * 8, "block hashes")?;
                Ok(RecordView::Routed {
                    request,
                    shape,
                    blocks: Blocks(bytes.chunks_exact(8)),
                })
            }
            FIRST_TOKEN => Ok(RecordView::FirstToken { request }),
            COMPLETED => Ok(RecordView::Completed { request }),
            other => Err(decode(format!("unknown record kind {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record() -> impl Strategy<Value = Record> {
        prop_oneof![
            (
                any::<u64>(),
                any::<u32>(),
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                any::<u32>(),
                proptest::collection::vec(any::<u64>(), 0..20),
            )
                .prop_map(|(request, endpoint, rank, a, b, output, blocks)| {
                    Record::Routed {
                        request,
                        endpoint,
                        rank,
                        prompt_tokens: a.max(b),
                        prefill_tokens: a.min(b),
                        output_tokens: output,
                        blocks: blocks.into_iter().map(BlockHash::new).collect(),
                    }
                }),
            any::<u64>().prop_map(|request| Record::FirstToken { request }),
            any::<u64>().prop_map(|request| Record::Completed { request }),
        ]
    }

    fn frame() -> impl Strategy<Value = Frame> {
        (
            any::<[u64; 5]>(),
            proptest::collection::vec(record(), 0..12),
        )
            .prop_map(
                |([replica, incarnation, seq, open, awaiting], records)| Frame {
                    replica,
                    incarnation,
                    seq,
                    open,
                    awaiting,
                    records,
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Every frame decodes to itself.
        #[test]
        fn frames_round_trip(f in frame()) {
            let mut bytes = Vec::new();
            f.encode(&mut bytes);
            prop_assert_eq!(Frame::decode(&bytes), Ok(f));
        }

        /// Every cut of a frame short of its end is an error, never a panic.
        #[test]
        fn truncated_frames_are_errors(f in frame(), cut in any::<prop::sample::Index>()) {
            let mut bytes = Vec::new();
            f.encode(&mut bytes);
            let cut = cut.index(bytes.len());
            prop_assert!(Frame::decode(&bytes[..cut]).is_err());
        }

        /// Garbage, and frames with bytes flipped or added, decode or fail: never a panic,
        /// and what decodes encodes back to the same bytes unless a varint was padded.
        #[test]
        fn garbage_never_panics(
            f in frame(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            tail in proptest::collection::vec(any::<u8>(), 0..3),
            noise in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let _ = Frame::decode(&noise);
            let mut with_version = vec![VERSION];
            with_version.extend_from_slice(&noise);
            let _ = Frame::decode(&with_version);
            let mut bytes = Vec::new();
            f.encode(&mut bytes);
            for (at, b) in flips {
                let i = at.index(bytes.len());
                bytes[i] ^= b;
            }
            bytes.extend_from_slice(&tail);
            let _ = Frame::decode(&bytes);
        }
    }

    #[test]
    fn another_version_is_refused_by_name() {
        let mut bytes = Vec::new();
        Frame {
            replica: 1,
            incarnation: 1,
            seq: 0,
            open: 1,
            awaiting: 1,
            records: Vec::new(),
        }
        .encode(&mut bytes);
        bytes[0] = 2;
        assert_eq!(
            Frame::decode(&bytes),
            Err(Error::ReplicaVersion {
                found: 2,
                supported: 1
            })
        );
    }

    #[test]
    fn a_huge_count_is_refused_before_reading() {
        let mut bytes = vec![VERSION];
        bytes.extend_from_slice(&[0; 24]);
        bytes.extend_from_slice(&[1, 1]);
        write_var(&mut bytes, u64::MAX);
        let e = Frame::decode(&bytes).unwrap_err().to_string();
        assert!(e.contains("records in"), "{e}");
    }

    #[test]
    fn varints_past_64_bits_are_refused() {
        let mut r = Reader(&[0xff; 11]);
        assert!(r.var("x").is_err());
        let mut max = Vec::new();
        write_var(&mut max, u64::MAX);
        assert_eq!(Reader(&max).var("x"), Ok(u64::MAX));
    }
}
