//! The crate's one error type.

use crate::tree::WorkerId;

/// Everything that can go wrong in `prefix_router`.
///
/// Messages are lowercase and say what was wrong and what is allowed. The enum is
/// `#[non_exhaustive]`: new failure modes may be added in minor releases.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A block size of zero or above [`PrefixHasher::MAX_BLOCK_SIZE`](crate::PrefixHasher::MAX_BLOCK_SIZE).
    #[error("invalid block size {block_size}: must be between 1 and {max} tokens")]
    InvalidBlockSize {
        /// The block size that was asked for.
        block_size: usize,
        /// The largest block size allowed.
        max: usize,
    },
    /// A configuration value is NaN, infinite or out of its allowed range.
    #[error("invalid {field} = {value}: {allowed}")]
    InvalidConfig {
        /// The configuration field.
        field: &'static str,
        /// The rejected value, rendered as text.
        value: String,
        /// What the field accepts.
        allowed: &'static str,
    },
    /// A worker id beyond what the structure can index.
    #[error("worker id {worker} is out of range: ids must be below {limit}")]
    WorkerOutOfRange {
        /// The rejected worker id.
        worker: u32,
        /// One past the largest accepted id.
        limit: u32,
    },
    /// The worker is not registered with this router.
    #[error("unknown worker {0:?}: add it with add_worker first")]
    UnknownWorker(WorkerId),
    /// The worker is already registered.
    #[error("worker {0:?} is already registered")]
    WorkerExists(WorkerId),
    /// An engine's events use another block size than the router's hasher (a common cause
    /// of "overlap is always 0").
    #[error(
        "block size mismatch: the engine's events carry {engine} tokens per block, the router hashes {router}; configure the router's block size to match the engine"
    )]
    BlockSizeMismatch {
        /// Tokens per block in the engine's events.
        engine: usize,
        /// The router's block size.
        router: usize,
    },
    /// A cache event that cannot be applied as it is.
    #[error("invalid cache event: {0}")]
    InvalidEvent(String),
    /// A wire payload (an engine's event batch) that cannot be decoded.
    #[error("cannot decode payload: {0}")]
    Decode(String),
    /// A trace line (1-based; 0 when the file itself cannot be read) that cannot be used.
    #[error("trace line {line}: {message}")]
    Trace {
        /// The line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// A [`Policy`](crate::Policy) chose an index outside the candidates it was given.
    #[error("policy {policy} chose candidate {index} of {candidates}")]
    InvalidChoice {
        /// The policy's name.
        policy: &'static str,
        /// The index it returned.
        index: usize,
        /// How many candidates it was given.
        candidates: usize,
    },
    /// A data-parallel rank beyond the ranks per endpoint of the
    /// [`RankLayout`](crate::RankLayout).
    #[error("rank {rank} is out of range: an endpoint has ranks 0..{ranks}")]
    InvalidRank {
        /// The rejected rank.
        rank: u32,
        /// Ranks per endpoint.
        ranks: u32,
    },
    /// Admission refused the request: no worker is predicted to meet its time-to-first-token
    /// target ([`RouteRequest::with_ttft_target`](crate::RouteRequest::with_ttft_target)).
    /// Nothing was charged or recorded; the host may answer 429 with
    /// [`Shed::retry_after`](crate::Shed::retry_after), or queue the request and route it
    /// again then.
    #[error("{0}")]
    Shed(crate::request::refusal::Shed),
    /// A worker's role does not allow what it was asked to do: a prefill-only worker as the
    /// decode side of a pair, a decode-only one as the prefill side, or a pair of one worker
    /// ([`PdRouter`](crate::PdRouter)).
    #[error("worker {} is {role} and cannot {wanted}", worker.index())]
    WrongRole {
        /// The worker.
        worker: crate::tree::WorkerId,
        /// Its role's name (`prefill`, `decode` or `both`).
        role: &'static str,
        /// What it was asked to do.
        wanted: &'static str,
    },
    /// A replica sync frame of a layout version this crate does not read
    /// ([`replica`](crate::replica)).
    #[error(
        "replica sync frame of version {found}: this router reads version {supported}; run one version of the crate on every replica"
    )]
    ReplicaVersion {
        /// The frame's version byte.
        found: u8,
        /// The version this crate writes and reads.
        supported: u8,
    },
    /// Replica sync refused a frame beyond one of its memory bounds
    /// ([`ReplicaConfig`](crate::ReplicaConfig)).
    #[error("replica sync: more than {limit} {what}; raise the bound or check the replica ids")]
    ReplicaLimit {
        /// What is bounded (`peers`).
        what: &'static str,
        /// The bound.
        limit: usize,
    },
    /// No worker is registered and available to take the request.
    #[error("no worker is available: add a worker or mark one available")]
    NoWorkers,
}
