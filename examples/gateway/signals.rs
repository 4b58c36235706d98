//! The router's fleet signals ([`Router::fleet_signals`](prefix_router::Router::fleet_signals))
//! as metrics, read when `/metrics` is: what an autoscaler behind the gateway scales on.
//!
//! - `gateway_router_tokens_total{kind}`: prompt tokens routed (`prompt`), those predicted
//!   cached at the chosen worker (`captured`), those the best holder held (`available`),
//!   and those left to prefill (`uncached`: the prefill demand; its rate is tokens/s).
//! - `gateway_router_predicted_hit_ratio`: captured over prompt tokens, since the start.
//! - `gateway_router_worker_wait_seconds{worker}`: each worker's saturation, the load
//!   model's predicted wait before a new request's own prefill starts.
//! - `gateway_router_worker_kv_usage{worker}`: each worker's last reported KV usage.
//! - admission's observed gates, once the gateway has reported timed first tokens and
//!   streamed progress: `gateway_router_worker_prefill_factor{worker}` (observed over
//!   predicted time to first token: the prefill window is the model's over it),
//!   `gateway_router_worker_outstanding_prefill_tokens{worker}` (the window's occupancy),
//!   `gateway_router_worker_prefill_tokens_per_second{worker}` (the observed prefill rate),
//!   `gateway_router_worker_step_seconds{worker}` (the observed time per output token) and
//!   `gateway_router_worker_prefill_share{worker}` (the decode bound's occupancy: the share
//!   of the worker's time admitted prefill takes).
//! - `gateway_router_shed_total{gate}`: refusals by the gate that bound them (`model`,
//!   `prompt`, `prefill_window`, `decode_bound`).
//!
//! A worker's series carry the label set `L` the gateway names its workers by (`worker`
//! in the aggregated mode; `role` and `worker` in the P/D mode). The router's counts are
//! cumulative: each counter here is moved up to the router's count at every read, so it
//! stays a Prometheus counter.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::AtomicU64;

use prefix_router::{FleetSignals, GATES, ObservedLoad, WorkerId};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::telemetry::WorkerLabels;

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// The fleet-signal metrics, each worker's labelled with an `L`.
pub(crate) struct SignalMetrics<L = WorkerLabels> {
    tokens: Family<KindLabels, Counter>,
    hit_ratio: FloatGauge,
    wait: Family<L, FloatGauge>,
    kv_usage: Family<L, FloatGauge>,
    /// Each worker's observed load, by figure.
    observed: [Family<L, FloatGauge>; OBSERVED.len()],
    shed_by_gate: Family<GateLabels, Counter>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GateLabels {
    gate: &'static str,
}

/// An observed-load metric: its name, its help, and its figure of an [`ObservedLoad`].
type ObservedMetric = (&'static str, &'static str, fn(&ObservedLoad) -> f64);

/// The observed-load metrics.
const OBSERVED: [ObservedMetric; 5] = [
    (
        "router_worker_prefill_factor",
        "Observed over predicted time to first token on the worker, with the wait for one as evidence",
        |o| o.prefill_factor,
    ),
    (
        "router_worker_outstanding_prefill_tokens",
        "Uncached prompt tokens routed to the worker and not yet at their first token: the prefill window's occupancy",
        |o| o.outstanding_prefill_tokens as f64,
    ),
    (
        "router_worker_prefill_tokens_per_second",
        "The worker's observed prefill rate, uncached prompt tokens per second",
        |o| o.prefill_tokens_per_s,
    ),
    (
        "router_worker_step_seconds",
        "The worker's observed time per output token, from streamed progress",
        |o| o.step_s,
    ),
    (
        "router_worker_prefill_share",
        "The decode bound's occupancy: the share of the worker's time admitted prefill takes, at the observed rate",
        |o| o.prefill_share,
    ),
];

impl<L: Clone + Hash + Eq> Default for SignalMetrics<L> {
    fn default() -> Self {
        Self {
            tokens: Family::default(),
            hit_ratio: FloatGauge::default(),
            wait: Family::default(),
            kv_usage: Family::default(),
            observed: Default::default(),
            shed_by_gate: Family::default(),
        }
    }
}

impl<L> SignalMetrics<L>
where
    L: EncodeLabelSet + Clone + Hash + Eq + Debug + Send + Sync + 'static,
{
    /// Registers every metric in `registry` (whose prefix is the gateway's).
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "router_tokens",
            "Prompt tokens routed, by kind: prompt, captured (cached at the chosen worker), available (cached at the best holder), uncached (to prefill)",
            self.tokens.clone(),
        );
        registry.register(
            "router_predicted_hit_ratio",
            "Prompt tokens predicted cached at the chosen workers over prompt tokens routed",
            self.hit_ratio.clone(),
        );
        registry.register_with_unit(
            "router_worker_wait",
            "The load model's predicted wait before a new request's own prefill starts on the worker",
            Unit::Seconds,
            self.wait.clone(),
        );
        registry.register(
            "router_worker_kv_usage",
            "The fraction of KV in use the worker last reported",
            self.kv_usage.clone(),
        );
        for ((name, help, _), family) in OBSERVED.iter().zip(&self.observed) {
            registry.register(*name, *help, family.clone());
        }
        registry.register(
            "router_shed",
            "Requests admission refused, by the gate that bound them",
            self.shed_by_gate.clone(),
        );
    }

    /// Sets every metric from `signals`, each worker's series labelled `label(worker)`; a
    /// worker it gives no labels is left out of the per-worker series (not of the totals).
    pub(crate) fn update(&self, signals: &FleetSignals, label: impl Fn(WorkerId) -> Option<L>) {
        for (kind, count) in [
            ("prompt", signals.prompt_tokens()),
            ("captured", signals.captured_tokens()),
            ("available", signals.available_tokens()),
            ("uncached", signals.uncached_tokens()),
        ] {
            let counter = self.tokens.get_or_create(&KindLabels { kind });
            counter.inc_by(count.saturating_sub(counter.get()));
        }
        self.hit_ratio.set(signals.predicted_hit_ratio());
        for (gate, count) in GATES.iter().zip(signals.shed_by_gate) {
            let counter = self
                .shed_by_gate
                .get_or_create(&GateLabels { gate: gate.name() });
            counter.inc_by(count.saturating_sub(counter.get()));
        }
        for w in &signals.workers {
            let Some(labels) = label(w.worker) else {
                continue;
            };
            self.wait.get_or_create(&labels).set(w.wait_s);
            self.kv_usage.get_or_create(&labels).set(w.kv_usage);
            if let Some(o) = &w.observed {
                for ((_, _, figure), family) in OBSERVED.iter().zip(&self.observed) {
                    family.get_or_create(&labels).set(figure(o));
                }
            }
        }
    }
}
