//! What a `Router` and its decisions share: the routers behind it and the event sequence
//! numbers it tracks. Below both, so that a decision can name its owner without importing
//! the router.

use crate::events::Seqs;
use crate::fleet::Routers;

/// What a `Router` and its decisions share.
pub(crate) struct Shared {
    pub(crate) routers: Routers,
    pub(crate) seqs: Seqs,
}
