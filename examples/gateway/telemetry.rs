//! The gateway's own metrics, served at `GET /metrics` in Prometheus text (version 0.0.4)
//! by the `prometheus-client` crate. Every name starts `gateway_`; `worker` is a routing
//! target's index, as in `/stats`, or `none` for a request no worker took.
//!
//! - `gateway_requests_total{worker, outcome}`: every completion request once, by what
//!   became of it ([`Outcome`]).
//! - `gateway_shed_total{limit, priority}`: requests admission refused, by the limit that
//!   bound the best worker (`queue`, `kv`, `decode`, `prompt`, `stale`) and their priority.
//! - `gateway_time_to_first_token_seconds{worker}`: streamed requests, from arrival to their
//!   first content event (a whole answer shows the gateway no first token).
//! - `gateway_request_duration_seconds{worker}`: requests a worker took, from arrival to
//!   the end of the answer, whatever the outcome.
//! - `gateway_predicted_cached_tokens_total{worker}`, `gateway_delivered_cached_tokens_total{worker}`
//!   and `gateway_reported_prompt_tokens_total{worker}`: over the requests whose engine
//!   reported its cached tokens (`usage.prompt_tokens_details.cached_tokens`), the cached
//!   tokens the router predicted, those the engine reported, and their prompt tokens.
//! - `gateway_upstream_failures_total{worker}`: attempts whose upstream could not be reached.
//! - `gateway_worker_in_flight{worker}`, `gateway_worker_available{worker}`: the fleet as the
//!   router sees it when `/metrics` is read ([`Telemetry::fleet_signals`]).
//! - `gateway_router_*`: the router's fleet signals (`signals.rs`).

use std::fmt::Write as _;
use std::time::Duration;

use prefix_router::{Priority, Router, Shed, WorkerId};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use super::signals::SignalMetrics;

/// The `Content-Type` of `GET /metrics`.
const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// What became of a completion request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Outcome {
    /// The upstream answered with a 2xx status: whole, or a stream that ran to its end.
    Served,
    /// Admission refused it (429).
    Shed,
    /// The gateway could not read it (400).
    Invalid,
    /// The upstream answered with an error status or its stream broke, or routing failed.
    Error,
    /// The upstream did not answer within the request timeout (504).
    Timeout,
    /// No worker could take it (503).
    Unavailable,
    /// The client went away before its stream ended.
    Cancelled,
}

impl Outcome {
    /// What can become of a request a worker took.
    pub(crate) const ROUTED: [Outcome; 4] = [
        Outcome::Served,
        Outcome::Error,
        Outcome::Timeout,
        Outcome::Cancelled,
    ];

    /// What can become of a request no worker took.
    pub(crate) const UNROUTED: [Outcome; 4] = [
        Outcome::Shed,
        Outcome::Invalid,
        Outcome::Error,
        Outcome::Unavailable,
    ];

    /// A stream's outcome: an error unless its upstream answered 2xx and the stream did not
    /// break (`intact`); then served when it ran to its end, cancelled when the client went
    /// away first.
    pub(crate) fn of_stream(intact: bool, ended: bool) -> Outcome {
        match (intact, ended) {
            (false, _) => Outcome::Error,
            (true, true) => Outcome::Served,
            (true, false) => Outcome::Cancelled,
        }
    }

    /// The outcome's label value.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Outcome::Served => "served",
            Outcome::Shed => "shed",
            Outcome::Invalid => "invalid",
            Outcome::Error => "error",
            Outcome::Timeout => "timeout",
            Outcome::Unavailable => "unavailable",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// The `worker` label: a target's index, or `none`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Target(Option<u32>);

impl EncodeLabelValue for Target {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        match self.0 {
            Some(index) => write!(encoder, "{index}"),
            None => encoder.write_str("none"),
        }
    }
}

impl From<Option<WorkerId>> for Target {
    fn from(worker: Option<WorkerId>) -> Self {
        Self(worker.map(|w| w.index() as u32))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct WorkerLabels {
    worker: Target,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    worker: Target,
    outcome: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ShedLabels {
    limit: &'static str,
    priority: &'static str,
}

type Histograms = Family<WorkerLabels, Histogram, fn() -> Histogram>;

/// 5 ms to about 41 s, doubling.
pub(crate) fn ttft_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// 10 ms to about 82 s, doubling.
pub(crate) fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

/// The gateway's metrics and the registry that writes them out. Every method may be called
/// from any thread.
pub(crate) struct Telemetry {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    shed: Family<ShedLabels, Counter>,
    ttft: Histograms,
    latency: Histograms,
    predicted_cached: Family<WorkerLabels, Counter>,
    delivered_cached: Family<WorkerLabels, Counter>,
    prompt_tokens: Family<WorkerLabels, Counter>,
    failures: Family<WorkerLabels, Counter>,
    in_flight: Family<WorkerLabels, Gauge>,
    available: Family<WorkerLabels, Gauge>,
    signals: SignalMetrics,
}

impl Telemetry {
    /// Every metric registered, with a zero series for each outcome of every one of
    /// `targets` workers (and of no worker), each refusal's limit and priority, and each
    /// worker's histograms, so that rates start from zero.
    pub(crate) fn new(targets: usize) -> Self {
        let mut telemetry = Self {
            registry: Registry::default(),
            requests: Family::default(),
            shed: Family::default(),
            ttft: Histograms::new_with_constructor(ttft_histogram),
            latency: Histograms::new_with_constructor(latency_histogram),
            predicted_cached: Family::default(),
            delivered_cached: Family::default(),
            prompt_tokens: Family::default(),
            failures: Family::default(),
            in_flight: Family::default(),
            available: Family::default(),
            signals: SignalMetrics::default(),
        };
        telemetry.registry = telemetry.registered();
        telemetry.zeroed(targets);
        telemetry
    }

    /// Creates the zero series [`new`](Self::new) promises.
    fn zeroed(&self, targets: usize) {
        for outcome in Outcome::UNROUTED {
            let worker = Target(None);
            let outcome = outcome.name();
            self.requests
                .get_or_create_owned(&RequestLabels { worker, outcome });
        }
        for index in 0..targets {
            let labels = labels(WorkerId::new(index as u32));
            for outcome in Outcome::ROUTED {
                let outcome = outcome.name();
                let worker = labels.worker;
                self.requests
                    .get_or_create_owned(&RequestLabels { worker, outcome });
            }
            self.ttft.get_or_create_owned(&labels);
            self.latency.get_or_create_owned(&labels);
        }
        for limit in ["queue", "kv", "decode", "prompt", "stale"] {
            for priority in [Priority::Sheddable, Priority::Standard] {
                let priority = priority.name();
                self.shed
                    .get_or_create_owned(&ShedLabels { limit, priority });
            }
        }
    }

    /// A registry of every metric, named and described.
    fn registered(&self) -> Registry {
        let mut r = Registry::with_prefix("gateway");
        r.register(
            "requests",
            "Completion requests by worker and outcome",
            self.requests.clone(),
        );
        r.register(
            "shed",
            "Requests admission refused, by limit and priority",
            self.shed.clone(),
        );
        for (name, help, histograms) in [
            (
                "time_to_first_token",
                "Streamed requests' time from arrival to the first content event",
                &self.ttft,
            ),
            (
                "request_duration",
                "Time from arrival to the end of the answer, for requests a worker took",
                &self.latency,
            ),
        ] {
            r.register_with_unit(name, help, Unit::Seconds, histograms.clone());
        }
        for (name, help, counters) in [
            (
                "predicted_cached_tokens",
                "Cached prompt tokens the router predicted, for requests whose engine reported",
                &self.predicted_cached,
            ),
            (
                "delivered_cached_tokens",
                "Cached prompt tokens the engine reported (usage.prompt_tokens_details.cached_tokens)",
                &self.delivered_cached,
            ),
            (
                "reported_prompt_tokens",
                "Prompt tokens of the requests whose engine reported cached tokens",
                &self.prompt_tokens,
            ),
            (
                "upstream_failures",
                "Attempts whose upstream could not be reached",
                &self.failures,
            ),
        ] {
            r.register(name, help, counters.clone());
        }
        for (name, help, gauges) in [
            (
                "worker_in_flight",
                "Requests routed to the worker and not completed",
                &self.in_flight,
            ),
            (
                "worker_available",
                "1 while the router may send the worker requests",
                &self.available,
            ),
        ] {
            r.register(name, help, gauges.clone());
        }
        self.signals.register(&mut r);
        r
    }

    /// A request ended with `outcome`; one `worker` took, `elapsed` after it arrived.
    pub(crate) fn finished(&self, worker: Option<WorkerId>, outcome: Outcome, elapsed: Duration) {
        let labels = RequestLabels {
            worker: worker.into(),
            outcome: outcome.name(),
        };
        self.requests.get_or_create(&labels).inc();
        if worker.is_some() {
            self.latency
                .get_or_create(&WorkerLabels {
                    worker: worker.into(),
                })
                .observe(elapsed.as_secs_f64());
        }
    }

    /// Admission refused a request.
    pub(crate) fn shed(&self, shed: &Shed) {
        self.finished(None, Outcome::Shed, Duration::ZERO);
        let labels = ShedLabels {
            limit: shed.limit.name(),
            priority: shed.priority.name(),
        };
        self.shed.get_or_create(&labels).inc();
    }

    /// A streamed request's first content event came `elapsed` after it arrived.
    pub(crate) fn first_token(&self, worker: WorkerId, elapsed: Duration) {
        self.ttft
            .get_or_create(&labels(worker))
            .observe(elapsed.as_secs_f64());
    }

    /// `worker`'s engine reported `delivered` of a request's `prompt` tokens cached, where
    /// the router predicted `predicted`.
    pub(crate) fn cached(&self, worker: WorkerId, predicted: u64, delivered: u64, prompt: u64) {
        let labels = labels(worker);
        self.predicted_cached
            .get_or_create(&labels)
            .inc_by(predicted);
        self.delivered_cached
            .get_or_create(&labels)
            .inc_by(delivered);
        self.prompt_tokens.get_or_create(&labels).inc_by(prompt);
    }

    /// `worker`'s upstream could not be reached.
    pub(crate) fn failure(&self, worker: WorkerId) {
        self.failures.get_or_create(&labels(worker)).inc();
    }

    /// Sets the gauges of the fleet as `router` sees it now, for targets `0..targets`: each
    /// worker's requests in flight and whether it is available, and the router's fleet
    /// signals.
    fn fleet_signals(&self, router: &dyn Router, targets: usize) {
        self.signals
            .update(&router.fleet_signals(), |w| Some(labels(w)));
        for index in 0..targets {
            let worker = WorkerId::new(index as u32);
            let Some(load) = router.load(worker) else {
                continue;
            };
            let labels = labels(worker);
            let in_flight = i64::try_from(load.in_flight).unwrap_or(i64::MAX);
            self.in_flight.get_or_create(&labels).set(in_flight);
            self.available
                .get_or_create(&labels)
                .set(i64::from(load.available));
        }
    }

    /// The metrics in Prometheus text, the fleet's gauges read from `router` (over targets
    /// `0..targets`) first.
    pub(crate) fn render(&self, router: &dyn Router, targets: usize) -> String {
        self.fleet_signals(router, targets);
        encode(&self.registry)
    }
}

/// `registry`'s metrics in Prometheus text.
pub(crate) fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing to a `String` cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, registry);
    text
}

/// The answer to `GET /metrics`: `text`, Prometheus text, with its content type.
pub(crate) fn response(text: String) -> axum::response::Response {
    use axum::response::IntoResponse;
    ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response()
}

pub(crate) fn labels(worker: WorkerId) -> WorkerLabels {
    WorkerLabels {
        worker: Some(worker).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_written_from_zero_and_counts_land_on_their_labels() {
        let telemetry = Telemetry::new(2);
        let router = prefix_router::BalancedRouter::new(2).unwrap_or_else(|e| panic!("{e}"));
        let fresh = telemetry.render(&router, 2);
        for line in [
            "# TYPE gateway_requests_total counter",
            "gateway_requests_total{worker=\"none\",outcome=\"shed\"} 0",
            "gateway_requests_total{worker=\"1\",outcome=\"served\"} 0",
            "gateway_shed_total{limit=\"queue\",priority=\"sheddable\"} 0",
            "# TYPE gateway_time_to_first_token_seconds histogram",
            "gateway_request_duration_seconds_count{worker=\"0\"} 0",
            "gateway_worker_available{worker=\"1\"} 1",
        ] {
            assert!(fresh.lines().any(|l| l == line), "{line} in\n{fresh}");
        }
        let w = WorkerId::new(1);
        telemetry.finished(Some(w), Outcome::Served, Duration::from_millis(30));
        telemetry.first_token(w, Duration::from_millis(7));
        telemetry.cached(w, 32, 16, 64);
        let text = telemetry.render(&router, 2);
        for line in [
            "gateway_requests_total{worker=\"1\",outcome=\"served\"} 1",
            "gateway_request_duration_seconds_bucket{worker=\"1\",le=\"0.02\"} 0",
            "gateway_request_duration_seconds_bucket{worker=\"1\",le=\"0.04\"} 1",
            "gateway_time_to_first_token_seconds_count{worker=\"1\"} 1",
            "gateway_predicted_cached_tokens_total{worker=\"1\"} 32",
            "gateway_delivered_cached_tokens_total{worker=\"1\"} 16",
            "gateway_reported_prompt_tokens_total{worker=\"1\"} 64",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
