//! Data-parallel ranks: each rank of an endpoint is a routing target of its own.

use crate::error::Error;

use crate::tree::{RadixTree, WorkerId};

/// How routing targets map to (endpoint, data-parallel rank).
///
/// With data-parallel attention each rank of an endpoint has its own KV cache and queue, so
/// each is a routing target: a [`WorkerId`] of its own, with its own mirror, load and
/// session stickiness. With `ranks` ranks per endpoint, target `endpoint × ranks + rank` is
/// that rank (endpoint `e` has targets `e × ranks .. (e + 1) × ranks`); a router over
/// `endpoints × ranks` targets routes to them, and the decision names the rank so the host
/// can set vLLM's `X-data-parallel-rank` header. One rank per endpoint (the default) makes
/// targets and endpoints the same.
///
/// ```
/// use prefix_router::{BalancedRouter, RankLayout, RouteRequest, Router, WorkerId};
///
/// let layout = RankLayout::new(4)?; // 2 endpoints × 4 ranks = 8 targets
/// let router = BalancedRouter::new(layout.targets(2))?.with_rank_layout(layout);
/// assert_eq!(layout.target(1, 2)?, WorkerId::new(6));
/// assert_eq!((layout.endpoint(WorkerId::new(6)), layout.rank(WorkerId::new(6))), (1, 2));
/// let d = router.route(&RouteRequest::new(&[1, 2, 3]))?;
/// assert_eq!(d.rank(), layout.rank(d.worker()));
/// assert!(layout.target(0, 4).is_err()); // no rank 4
/// # Ok::<(), prefix_router::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RankLayout {
    ranks: u32,
}

impl Default for RankLayout {
    fn default() -> Self {
        Self { ranks: 1 }
    }
}

impl RankLayout {
    /// `ranks` data-parallel ranks per endpoint.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for 0 ranks or more than [`RadixTree::MAX_WORKERS`].
    pub fn new(ranks: u32) -> Result<Self, Error> {
        crate::config::int(
            "ranks",
            ranks,
            1..=RadixTree::MAX_WORKERS,
            "between 1 and 4096 ranks per endpoint",
        )?;
        Ok(Self { ranks })
    }

    /// Ranks per endpoint.
    #[must_use]
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// Targets of `endpoints` endpoints (saturating).
    #[must_use]
    pub fn targets(&self, endpoints: u32) -> u32 {
        endpoints.saturating_mul(self.ranks)
    }

    /// The target of `rank` of `endpoint`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidRank`] when `rank` is not below the layout's ranks;
    /// [`Error::WorkerOutOfRange`] when the target's id would reach
    /// [`RadixTree::MAX_WORKERS`].
    pub fn target(&self, endpoint: u32, rank: u32) -> Result<WorkerId, Error> {
        if rank >= self.ranks {
            return Err(Error::InvalidRank {
                rank,
                ranks: self.ranks,
            });
        }
        let id = u64::from(endpoint) * u64::from(self.ranks) + u64::from(rank);
        match u32::try_from(id) {
            Ok(id) if id < RadixTree::MAX_WORKERS => Ok(WorkerId::new(id)),
            _ => Err(Error::WorkerOutOfRange {
                worker: u32::try_from(id).unwrap_or(u32::MAX),
                limit: RadixTree::MAX_WORKERS,
            }),
        }
    }

    /// The endpoint of `target`.
    #[must_use]
    pub fn endpoint(&self, target: WorkerId) -> u32 {
        target.get() / self.ranks
    }

    /// The rank of `target` within its endpoint.
    #[must_use]
    pub fn rank(&self, target: WorkerId) -> u32 {
        target.get() % self.ranks
    }
}
