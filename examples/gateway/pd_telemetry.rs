//! The P/D gateway's own metrics, served at `GET /metrics` in Prometheus text (version
//! 0.0.4) by the `prometheus-client` crate, with the aggregated gateway's outcomes,
//! histogram buckets and encoding (`telemetry.rs`). Every name starts `gateway_`; `role` is
//! a side (`prefill` or `decode`) and `worker` a target's index on its side, as in
//! `/stats`; `plan` is how a request was served: `split` (prefilled on a prefill worker,
//! with transfer parameters or without), `local` (by its decode worker alone), or `none`
//! when no plan's workers took it.
//!
//! - `gateway_requests_total{plan, outcome}`: every completion request once, by its last
//!   plan and what became of it ([`Outcome`]); a failed prefill leg is its request's
//!   `error`, or `timeout` when the leg did not answer in time.
//! - `gateway_prefill_failures_total{role, worker}`: prefill legs that failed (an error
//!   status, an unreadable answer, a timeout), so that the client got the error: `/stats`'
//!   `prefill_failed`, by prefill target.
//! - `gateway_prefill_without_params_total{role, worker}`: prefill legs answered without
//!   `kv_transfer_params`, whose decode worker prefilled again: `/stats`' `without_params`.
//! - `gateway_upstream_failures_total{role, worker}`: attempts that could not reach the
//!   target (it is out of planning until its health probe answers).
//! - `gateway_time_to_first_token_seconds{plan}`: streamed requests, from arrival to the
//!   decode leg's first content event (a whole answer shows the gateway no first token).
//! - `gateway_request_duration_seconds{plan}`: requests a plan took, from arrival to the
//!   end of the answer, whatever the outcome.
//! - `gateway_worker_in_flight{role, worker}`, `gateway_worker_available{role, worker}`:
//!   each side as the planner sees it when `/metrics` is read.
//! - `gateway_router_*`: the fleet signals of the router under the planner (`signals.rs`),
//!   a worker's series labelled with its side and target. Both legs of a split request
//!   count there: its prompt is routed to the prefill worker, and to the decode worker as
//!   cached (its KV comes with the handoff), so `uncached` stays the prompt tokens to
//!   prefill.

use std::time::Duration;

use prefix_router::WorkerId;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::pd_plan::{PairPlanner, Role};
use super::signals::SignalMetrics;
use super::telemetry::{self, Outcome, Target};

/// How a request's last plan served it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PlanKind {
    /// Prefilled on a prefill worker, then decoded on a decode worker.
    Split,
    /// Prefilled and decoded on a decode worker.
    Local,
}

impl PlanKind {
    /// The `plan` label's value; `none` for no plan.
    fn name(plan: Option<PlanKind>) -> &'static str {
        match plan {
            Some(PlanKind::Split) => "split",
            Some(PlanKind::Local) => "local",
            None => "none",
        }
    }
}

/// A target's labels: its side and its index there.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct SideLabels {
    role: &'static str,
    worker: Target,
}

impl SideLabels {
    fn of(role: Role, target: WorkerId) -> Self {
        Self {
            role: role.name(),
            worker: Some(target).into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    plan: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PlanLabels {
    plan: &'static str,
}

type Histograms = Family<PlanLabels, Histogram, fn() -> Histogram>;

/// The P/D gateway's metrics and the registry that writes them out. Every method may be
/// called from any thread.
pub(crate) struct PdTelemetry {
    registry: Registry,
    /// Each side and its number of targets.
    sides: [(Role, u32); 2],
    requests: Family<RequestLabels, Counter>,
    prefill_failures: Family<SideLabels, Counter>,
    without_params: Family<SideLabels, Counter>,
    unreachable: Family<SideLabels, Counter>,
    ttft: Histograms,
    latency: Histograms,
    in_flight: Family<SideLabels, Gauge>,
    available: Family<SideLabels, Gauge>,
    signals: SignalMetrics<SideLabels>,
}

impl PdTelemetry {
    /// Every metric registered for `prefill_targets` and `decode_targets`, with a zero
    /// series for each outcome of each plan (and of none), each plan's histograms and each
    /// target's counters, so that rates start from zero.
    pub(crate) fn new(prefill_targets: u32, decode_targets: u32) -> Self {
        let mut telemetry = Self {
            registry: Registry::default(),
            sides: [
                (Role::Prefill, prefill_targets),
                (Role::Decode, decode_targets),
            ],
            requests: Family::default(),
            prefill_failures: Family::default(),
            without_params: Family::default(),
            unreachable: Family::default(),
            ttft: Histograms::new_with_constructor(telemetry::ttft_histogram),
            latency: Histograms::new_with_constructor(telemetry::latency_histogram),
            in_flight: Family::default(),
            available: Family::default(),
            signals: SignalMetrics::default(),
        };
        telemetry.registry = telemetry.registered();
        telemetry.zeroed();
        telemetry
    }

    /// Creates the zero series [`new`](Self::new) promises.
    fn zeroed(&self) {
        let request = |plan, outcome: Outcome| {
            let plan = PlanKind::name(plan);
            let outcome = outcome.name();
            self.requests
                .get_or_create_owned(&RequestLabels { plan, outcome });
        };
        for outcome in Outcome::UNROUTED {
            request(None, outcome);
        }
        for plan in [PlanKind::Split, PlanKind::Local] {
            for outcome in Outcome::ROUTED {
                request(Some(plan), outcome);
            }
            let labels = PlanLabels {
                plan: PlanKind::name(Some(plan)),
            };
            self.ttft.get_or_create_owned(&labels);
            self.latency.get_or_create_owned(&labels);
        }
        for (role, targets) in self.sides {
            for t in (0..targets).map(WorkerId::new) {
                let labels = SideLabels::of(role, t);
                self.unreachable.get_or_create_owned(&labels);
                if role == Role::Prefill {
                    self.prefill_failures.get_or_create_owned(&labels);
                    self.without_params.get_or_create_owned(&labels);
                }
            }
        }
    }

    /// A registry of every metric, named and described.
    fn registered(&self) -> Registry {
        let mut r = Registry::with_prefix("gateway");
        r.register(
            "requests",
            "Completion requests by plan (split, local, none) and outcome",
            self.requests.clone(),
        );
        for (name, help, counters) in [
            (
                "prefill_failures",
                "Prefill legs that failed (an error status, an unreadable answer, a timeout)",
                &self.prefill_failures,
            ),
            (
                "prefill_without_params",
                "Prefill legs answered without kv_transfer_params: the decode worker prefilled again",
                &self.without_params,
            ),
            (
                "upstream_failures",
                "Attempts whose target could not be reached",
                &self.unreachable,
            ),
        ] {
            r.register(name, help, counters.clone());
        }
        for (name, help, histograms) in [
            (
                "time_to_first_token",
                "Streamed requests' time from arrival to the decode leg's first content event",
                &self.ttft,
            ),
            (
                "request_duration",
                "Requests' time from arrival to the end of the answer",
                &self.latency,
            ),
        ] {
            r.register_with_unit(name, help, Unit::Seconds, histograms.clone());
        }
        for (name, help, gauges) in [
            (
                "worker_in_flight",
                "Requests planned on the target and not released",
                &self.in_flight,
            ),
            (
                "worker_available",
                "1 while the planner may choose the target",
                &self.available,
            ),
        ] {
            r.register(name, help, gauges.clone());
        }
        self.signals.register(&mut r);
        r
    }

    /// A request ended with `outcome`, `elapsed` after it arrived, served by `plan` (`None`
    /// when no plan's workers took it).
    pub(crate) fn finished(&self, plan: Option<PlanKind>, outcome: Outcome, elapsed: Duration) {
        let name = PlanKind::name(plan);
        let labels = RequestLabels {
            plan: name,
            outcome: outcome.name(),
        };
        self.requests.get_or_create(&labels).inc();
        if plan.is_some() {
            self.latency
                .get_or_create(&PlanLabels { plan: name })
                .observe(elapsed.as_secs_f64());
        }
    }

    /// A streamed request's decode leg sent its first content event `elapsed` after the
    /// request arrived.
    pub(crate) fn first_token(&self, plan: PlanKind, elapsed: Duration) {
        let plan = PlanKind::name(Some(plan));
        self.ttft
            .get_or_create(&PlanLabels { plan })
            .observe(elapsed.as_secs_f64());
    }

    /// The prefill leg on prefill target `target` failed.
    pub(crate) fn prefill_failed(&self, target: WorkerId) {
        let labels = SideLabels::of(Role::Prefill, target);
        self.prefill_failures.get_or_create(&labels).inc();
    }

    /// The prefill leg on prefill target `target` answered without transfer parameters.
    pub(crate) fn without_params(&self, target: WorkerId) {
        let labels = SideLabels::of(Role::Prefill, target);
        self.without_params.get_or_create(&labels).inc();
    }

    /// `target` of `role`'s side could not be reached.
    pub(crate) fn unreachable(&self, role: Role, target: WorkerId) {
        let labels = SideLabels::of(role, target);
        self.unreachable.get_or_create(&labels).inc();
    }

    /// Sets the gauges of both sides as `planner` sees them now: each target's requests in
    /// flight and whether it is available, and the router's fleet signals.
    fn sides(&self, planner: &dyn PairPlanner) {
        let signals = planner.fleet_signals();
        self.signals.update(&signals, |w| {
            let (role, target) = planner.target(w)?;
            Some(SideLabels::of(role, target))
        });
        for (role, targets) in self.sides {
            for t in (0..targets).map(WorkerId::new) {
                let Some(load) = planner.load(role, t) else {
                    continue;
                };
                let labels = SideLabels::of(role, t);
                let in_flight = i64::try_from(load.in_flight).unwrap_or(i64::MAX);
                self.in_flight.get_or_create(&labels).set(in_flight);
                self.available
                    .get_or_create(&labels)
                    .set(i64::from(load.available));
            }
        }
    }

    /// The metrics in Prometheus text, the sides' gauges read from `planner` first.
    pub(crate) fn render(&self, planner: &dyn PairPlanner) -> String {
        self.sides(planner);
        telemetry::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::super::pd_plan::PdPlanner;
    use super::*;

    #[test]
    fn every_metric_is_written_from_zero_and_counts_land_on_their_labels() {
        let planner = PdPlanner::new(1, 2, 16, Box::new(prefix_router::AlwaysSplit))
            .unwrap_or_else(|e| panic!("{e}"));
        let telemetry = PdTelemetry::new(1, 2);
        let fresh = telemetry.render(&planner);
        for line in [
            "# TYPE gateway_requests_total counter",
            "gateway_requests_total{plan=\"none\",outcome=\"invalid\"} 0",
            "gateway_requests_total{plan=\"split\",outcome=\"served\"} 0",
            "gateway_requests_total{plan=\"local\",outcome=\"cancelled\"} 0",
            "gateway_prefill_failures_total{role=\"prefill\",worker=\"0\"} 0",
            "gateway_prefill_without_params_total{role=\"prefill\",worker=\"0\"} 0",
            "gateway_upstream_failures_total{role=\"decode\",worker=\"1\"} 0",
            "# TYPE gateway_time_to_first_token_seconds histogram",
            "gateway_request_duration_seconds_count{plan=\"local\"} 0",
            "gateway_worker_available{role=\"prefill\",worker=\"0\"} 1",
            "gateway_worker_in_flight{role=\"decode\",worker=\"1\"} 0",
            "gateway_router_worker_wait_seconds{role=\"decode\",worker=\"1\"} 0.008",
        ] {
            assert!(fresh.lines().any(|l| l == line), "{line} in\n{fresh}");
        }
        assert!(
            !fresh.contains("worker=\"2\""),
            "the router's third worker is decode target 1:\n{fresh}"
        );
        telemetry.finished(
            Some(PlanKind::Split),
            Outcome::Served,
            Duration::from_millis(30),
        );
        telemetry.first_token(PlanKind::Split, Duration::from_millis(7));
        telemetry.finished(None, Outcome::Unavailable, Duration::ZERO);
        telemetry.prefill_failed(WorkerId::new(0));
        telemetry.unreachable(Role::Decode, WorkerId::new(1));
        let text = telemetry.render(&planner);
        for line in [
            "gateway_requests_total{plan=\"split\",outcome=\"served\"} 1",
            "gateway_requests_total{plan=\"none\",outcome=\"unavailable\"} 1",
            "gateway_request_duration_seconds_bucket{plan=\"split\",le=\"0.02\"} 0",
            "gateway_request_duration_seconds_bucket{plan=\"split\",le=\"0.04\"} 1",
            "gateway_time_to_first_token_seconds_count{plan=\"split\"} 1",
            "gateway_request_duration_seconds_count{plan=\"local\"} 0",
            "gateway_prefill_failures_total{role=\"prefill\",worker=\"0\"} 1",
            "gateway_upstream_failures_total{role=\"decode\",worker=\"1\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
