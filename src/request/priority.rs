//! How a request's priority bears on admission: [`AdmissionConfig`] (the share of its target
//! a sheddable request is held to, the room given to oversized prompts) and a priority's
//! name.

use std::time::Duration;

use super::refusal::Priority;
use crate::error::Error;

/// How admission treats priorities.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct AdmissionConfig {
    /// The share of its time-to-first-token target a [`Priority::Sheddable`] request is
    /// held to, in `(0, 1]`: at 0.5 sheddable requests are refused once the best worker's
    /// predicted time to first token passes half their target, leaving the rest of the
    /// queue to standard ones. A time-per-output-token target is held whole whatever the
    /// priority: a decode step is shared by every request running on the worker, so a
    /// share would refuse sheddable requests the steps serve within their target, and
    /// spare no standard one. Default 0.5.
    pub sheddable_share: f64,
    /// For a request whose own prefill alone is predicted to miss its target (an idle
    /// worker could not meet it either, [`Limit::Prompt`](crate::Limit::Prompt)): the share of its target the rest
    /// of its predicted time (the wait ahead of it, the steps it shares) may take. Such a
    /// request is served where it delays little and refused where the fleet is busy, when it
    /// would stall others for nothing it could meet. In `[0, 1]`; 0 refuses every such
    /// request. Default 0.1.
    pub oversized_wait_share: f64,
    /// The requests admission lets a worker hold (routed, not completed) before the host has
    /// reported any progress of its streams from it ([`Router::tokens_after`](crate::Router::tokens_after)),
    /// once the host reports timed first tokens or progress from any worker: a fleet whose
    /// decode the router cannot yet see is not filled on the model's word alone. From the
    /// first progress report on, the worker's observed step bounds it instead. 0: no such
    /// bound (for a host that times first tokens but never reports progress). Default 4.
    pub initial_decode_window: u32,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            sheddable_share: 0.5,
            oversized_wait_share: 0.1,
            initial_decode_window: 4,
        }
    }
}

impl AdmissionConfig {
    crate::config::setters! {
        /// Sets [`sheddable_share`](Self::sheddable_share).
        with_sheddable_share: sheddable_share: f64;
        /// Sets [`oversized_wait_share`](Self::oversized_wait_share).
        with_oversized_wait_share: oversized_wait_share: f64;
        /// Sets [`initial_decode_window`](Self::initial_decode_window).
        with_initial_decode_window: initial_decode_window: u32;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first field out of its range.
    pub fn validate(&self) -> Result<(), Error> {
        crate::config::float(
            "sheddable_share",
            self.sheddable_share,
            f64::MIN_POSITIVE..=1.0,
            "a share above 0 and at most 1",
        )?;
        crate::config::float(
            "oversized_wait_share",
            self.oversized_wait_share,
            0.0..=1.0,
            "a share from 0 to 1",
        )
    }

    /// The time-to-first-token target a request of `priority` asking for `target` is held
    /// to (a share of a target too long to scale exactly, such as `Duration::MAX`, is at
    /// most the target).
    #[must_use]
    pub fn target_of(&self, priority: Priority, target: Duration) -> Duration {
        match priority {
            Priority::Sheddable => {
                let share = target.as_secs_f64() * self.sheddable_share;
                Duration::try_from_secs_f64(share).map_or(target, |held| held.min(target))
            }
            Priority::Standard | Priority::Critical => target,
        }
    }
}

/// Names, for hosts that read priorities from headers or flags.
impl Priority {
    /// The priority named `name` (as [`name`](Self::name) gives it).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for any other name.
    pub fn parse(name: &str) -> Result<Self, Error> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                crate::config::invalid("priority", name, "critical, standard or sheddable")
            })
    }
}
