//! [`MissWeight`]: what a prompt token a worker must recompute weighs in
//! [`BalancedRouter`](crate::BalancedRouter)'s predicted time, against a token already
//! queued there.

use crate::config::float;
use crate::error::Error;
use crate::fleet::Candidate;

/// What a recomputed prompt token weighs in [`BalancedRouter`](crate::BalancedRouter)'s
/// predicted time: its prefill at the worker's speed (once more for each request waiting
/// there), and `weight − 1` times more at the configured speed, the same on every worker
/// (what recomputing it costs the rest of the fleet, in capacity and in the cache it
/// evicts).
///
/// A recomputation costs the fleet little while it has spare prefill capacity, and much
/// once every worker is queued: the default prices it by the fleet's load at the moment
/// ([`MissWeight::Fleet`]), so that on an idle fleet (a fleet larger than its load, a new
/// agent session while other workers idle) a prompt goes where it starts soonest, paying
/// its own prefill once, and on a busy fleet the router accepts queueing for locality.
/// [`MissWeight::Fixed`] keeps one weight whatever the fleet's state.
///
/// ```
/// use prefix_router::{BalancedConfig, MissWeight};
///
/// let fixed = BalancedConfig::default().with_miss_weight(3.0);
/// assert_eq!(fixed.miss_weight, MissWeight::Fixed(3.0));
/// assert_eq!(BalancedConfig::default().miss_weight, MissWeight::Fleet { max: 30.0 });
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum MissWeight {
    /// `1 + (max − 1) × L`, with `L` the fleet's load when the request is routed
    /// ([`Candidate::fleet_load`]: the mean over the registered workers of their load
    /// beyond an idle worker's, each capped at
    /// [`LoadConfig::busy_horizon`](crate::LoadConfig::busy_horizon), as a share of it).
    /// One recomputation on an idle fleet, `max` once every worker's queue reaches the
    /// horizon; the same for every candidate of one request. The default: `max` 30 (the
    /// simulator's results matrix chose it: `benches/README.md`).
    Fleet {
        /// The weight once every worker is fully busy, at least 1.
        max: f64,
    },
    /// The same weight whatever the fleet's state, at least 1.
    Fixed(f64),
}

impl Default for MissWeight {
    fn default() -> Self {
        MissWeight::Fleet { max: 30.0 }
    }
}

impl From<f64> for MissWeight {
    /// A fixed weight.
    fn from(weight: f64) -> Self {
        MissWeight::Fixed(weight)
    }
}

impl MissWeight {
    /// Checks the weight.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] (`miss_weight`) for a weight below 1 or not finite.
    pub fn validate(&self) -> Result<(), Error> {
        match *self {
            MissWeight::Fixed(w) | MissWeight::Fleet { max: w } => {
                float("miss_weight", w, 1.0..=1e6, "at least 1.0")
            }
        }
    }

    /// The weight for a request whose candidates carry the fleet's load `c.fleet_load()`.
    #[inline]
    pub(crate) fn of(&self, c: &Candidate) -> f64 {
        match *self {
            MissWeight::Fleet { max } => 1.0 + (max - 1.0) * c.fleet_load(),
            MissWeight::Fixed(w) => w,
        }
    }
}
