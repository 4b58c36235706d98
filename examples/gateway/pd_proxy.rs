//! The P/D request path: plan a pair, send the prefill leg, then the decode leg with the
//! prefill's transfer parameters, and answer the client from the decode leg, whole or
//! streamed as it comes (`pd_wire.rs` has the protocol).
//!
//! A worker that cannot be reached is taken out of planning (the health probes bring it
//! back), the plan completed, and the request planned again, up to three plans. A prefill
//! leg that fails otherwise ends the request: an error status of 500 and above, or an
//! unreadable answer, is a `502` naming the prefill worker (a `4xx` keeps its status: the
//! request was refused), no answer within the request timeout a `504`. The decode leg's
//! answer, error statuses included, is the client's. Every plan is completed exactly once:
//! when the whole answer was read, when a stream ends or its client goes away, or when a
//! leg fails. Every request is counted once in the gateway's metrics (`pd_telemetry.rs`),
//! by its last plan and outcome, before its plan is completed: once nothing is in flight,
//! the metrics count every request.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use prefix_router::{Error, WorkerId};
use serde_json::{Map, Value};

use super::app::{Incoming, error, shed_response};
use super::pd::PdGateway;
use super::pd_plan::{Plan, Role};
use super::pd_telemetry::PlanKind;
use super::pd_wire as wire;
use super::prompt::Endpoint;
use super::stream::Events;
use super::telemetry::Outcome;

/// What both legs of a request share.
struct Legs {
    endpoint: Endpoint,
    /// `X-Request-Id` on both legs.
    id: String,
    /// The client's body.
    body: Map<String, Value>,
    streamed: bool,
    /// When the request arrived.
    started: Instant,
}

/// Plans for one request at most: each worker that could not be reached is out of the
/// next plan.
const ATTEMPTS: usize = 3;

/// Plans a request and answers it, planning again (up to [`ATTEMPTS`] plans) when a worker
/// could not be reached.
pub(crate) async fn handle(
    gw: Arc<PdGateway>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let read = Incoming::read(
        gw.prompts.as_deref(),
        &gw.loras,
        endpoint,
        &headers,
        body.clone(),
    );
    let incoming = match read {
        Ok(i) => i,
        Err(message) => {
            let response = error(StatusCode::BAD_REQUEST, message);
            return unplanned(&gw, started, Outcome::Invalid, response);
        }
    };
    let Ok(Value::Object(client_body)) = serde_json::from_slice(&body) else {
        let response = error(StatusCode::BAD_REQUEST, "the body must be a JSON object");
        return unplanned(&gw, started, Outcome::Invalid, response);
    };
    let legs = Legs {
        endpoint,
        id: wire::request_id(&headers),
        body: client_body,
        streamed: incoming.streamed,
        started,
    };
    let request = incoming.route_request().with_time(gw.clock());
    for _ in 0..ATTEMPTS {
        let (outcome, response) = match gw.planner.plan(&request) {
            Ok(plan) => match serve(&gw, &legs, plan).await {
                Some(response) => return response,
                None => continue,
            },
            Err(Error::NoWorkers) => (
                Outcome::Unavailable,
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "no decode worker is available: every decode worker is down or draining",
                ),
            ),
            Err(Error::Shed(shed)) => (Outcome::Shed, shed_response(&shed)),
            Err(e) => (
                Outcome::Error,
                error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            ),
        };
        return unplanned(&gw, started, outcome, response);
    }
    let message = format!(
        "no planned worker could be reached in {ATTEMPTS} plans; each is out of planning \
         until its health probe answers"
    );
    let response = error(StatusCode::SERVICE_UNAVAILABLE, message);
    unplanned(&gw, started, Outcome::Unavailable, response)
}

/// Counts a request that arrived at `started` and ended with `outcome` and `response`
/// before any plan's workers took it.
fn unplanned(gw: &PdGateway, started: Instant, outcome: Outcome, response: Response) -> Response {
    gw.telemetry.finished(None, outcome, started.elapsed());
    response
}

/// Counts a request served by `plan` that ended with `response`, a whole answer or an
/// error: served if its status is 2xx, a timeout if `504`, else an error.
fn planned(gw: &PdGateway, legs: &Legs, plan: PlanKind, response: Response) -> Response {
    let outcome = match response.status() {
        s if s.is_success() => Outcome::Served,
        StatusCode::GATEWAY_TIMEOUT => Outcome::Timeout,
        _ => Outcome::Error,
    };
    gw.telemetry
        .finished(Some(plan), outcome, legs.started.elapsed());
    response
}

/// How the prefill leg went.
enum Prefilled {
    /// It answered with transfer parameters.
    Params(Value),
    /// It answered without: the decode worker will prefill again.
    NoParams,
    /// Its worker could not be reached.
    Unreachable,
    /// It failed otherwise: the client's answer.
    Failed(Response),
}

/// How the request was served, counted when the decode leg answers.
#[derive(Clone, Copy)]
enum Kind {
    Split,
    Local,
    WithoutParams,
}

impl Kind {
    /// Its plan, as the metrics name it.
    fn plan(self) -> PlanKind {
        match self {
            Kind::Split | Kind::WithoutParams => PlanKind::Split,
            Kind::Local => PlanKind::Local,
        }
    }
}

/// Sends `plan`'s legs and answers; `None` when a worker could not be reached (it is out
/// of planning and `plan` completed).
async fn serve(gw: &Arc<PdGateway>, legs: &Legs, plan: Plan) -> Option<Response> {
    let Some(prefill) = plan.prefill() else {
        return decode(gw, legs, plan, None, Kind::Local).await;
    };
    let params = match prefill_leg(gw, legs, prefill).await {
        Prefilled::Params(params) => Some(params),
        Prefilled::NoParams => None,
        Prefilled::Unreachable => {
            gw.unreachable(Role::Prefill, prefill);
            gw.planner.complete(&plan);
            return None;
        }
        Prefilled::Failed(response) => {
            gw.counts
                .prefill_failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            gw.telemetry.prefill_failed(prefill);
            let response = planned(gw, legs, PlanKind::Split, response);
            gw.planner.complete(&plan);
            return Some(response);
        }
    };
    gw.planner.prefill_done(&plan);
    let kind = if params.is_some() {
        Kind::Split
    } else {
        Kind::WithoutParams
    };
    decode(gw, legs, plan, params.as_ref(), kind).await
}

/// A leg's request to target `t` of `role`'s side: `body` as JSON, the request's id, and
/// the target's rank when its endpoints have several.
fn leg(
    gw: &PdGateway,
    role: Role,
    t: WorkerId,
    legs: &Legs,
    body: &Value,
) -> reqwest::RequestBuilder {
    let side = gw.side(role);
    let mut request = gw
        .client
        .post(side.url(t, legs.endpoint.path()))
        .header(header::CONTENT_TYPE, "application/json")
        .header(wire::REQUEST_ID, &legs.id)
        .body(body.to_string());
    if let Some(rank) = side.rank_header(t) {
        request = request.header(wire::DP_RANK, rank);
    }
    request
}

/// Sends the prefill leg to prefill target `t` and reads its transfer parameters.
async fn prefill_leg(gw: &PdGateway, legs: &Legs, t: WorkerId) -> Prefilled {
    let body = wire::prefill_body(&legs.body);
    let url = gw.prefill.url(t, legs.endpoint.path());
    let sent = leg(gw, Role::Prefill, t, legs, &body)
        .timeout(gw.request_timeout)
        .send()
        .await;
    let answer = match sent {
        Ok(answer) => answer,
        Err(e) if e.is_timeout() => return Prefilled::Failed(prefill_timeout(gw, &url)),
        Err(_) => return Prefilled::Unreachable,
    };
    let status = answer.status();
    let bytes = match answer.bytes().await {
        Ok(bytes) => bytes,
        Err(e) if e.is_timeout() => return Prefilled::Failed(prefill_timeout(gw, &url)),
        Err(e) => {
            let message = format!("the prefill worker {url} broke off its answer: {e}");
            return Prefilled::Failed(error(StatusCode::BAD_GATEWAY, message));
        }
    };
    if !status.is_success() {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(500)]).into_owned();
        let message = format!("the prefill worker {url} answered {status}: {text}");
        let status = match StatusCode::from_u16(status.as_u16()) {
            Ok(s) if s.is_client_error() => s,
            _ => StatusCode::BAD_GATEWAY,
        };
        return Prefilled::Failed(error(status, message));
    }
    match wire::transfer_params(&bytes) {
        Some(params) => Prefilled::Params(params),
        None => Prefilled::NoParams,
    }
}

fn prefill_timeout(gw: &PdGateway, url: &str) -> Response {
    let message = format!(
        "the prefill worker {url} did not answer within the gateway's request timeout ({} s)",
        gw.request_timeout.as_secs_f64()
    );
    error(StatusCode::GATEWAY_TIMEOUT, message)
}

/// Sends the decode leg (the client's body, with `params` when given) and answers from it;
/// `None` when the decode worker could not be reached.
async fn decode(
    gw: &Arc<PdGateway>,
    legs: &Legs,
    plan: Plan,
    params: Option<&Value>,
    kind: Kind,
) -> Option<Response> {
    let t = plan.decode();
    let mut request = leg(
        gw,
        Role::Decode,
        t,
        legs,
        &wire::decode_body(&legs.body, params),
    );
    if !legs.streamed {
        request = request.timeout(gw.request_timeout);
    }
    let answer = match tokio::time::timeout(gw.request_timeout, request.send()).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) if !e.is_timeout() => {
            gw.unreachable(Role::Decode, t);
            gw.planner.complete(&plan);
            return None;
        }
        Err(_) | Ok(Err(_)) => {
            let response = planned(gw, legs, kind.plan(), decode_timeout(gw));
            gw.planner.complete(&plan);
            return Some(response);
        }
    };
    count(gw, kind, &plan);
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers = receipt(gw, legs, &plan, !matches!(kind, Kind::Local));
    if legs.streamed {
        let body = pass_through(Arc::clone(gw), legs, plan, kind.plan(), answer);
        return Some((status, headers, body).into_response());
    }
    let bytes = answer.bytes().await;
    if bytes.is_ok() && status.is_success() {
        gw.planner.first_token(&plan);
    }
    let response = match bytes {
        Ok(bytes) => (status, headers, bytes).into_response(),
        Err(e) if e.is_timeout() => decode_timeout(gw),
        Err(e) => error(
            StatusCode::BAD_GATEWAY,
            format!("the decode worker broke off its answer: {e}"),
        ),
    };
    let response = planned(gw, legs, kind.plan(), response);
    gw.planner.complete(&plan);
    Some(response)
}

fn decode_timeout(gw: &PdGateway) -> Response {
    let message = format!(
        "the decode worker did not answer within the gateway's request timeout ({} s)",
        gw.request_timeout.as_secs_f64()
    );
    error(StatusCode::GATEWAY_TIMEOUT, message)
}

/// Counts how `plan`'s request was served, once its decode leg answered.
fn count(gw: &PdGateway, kind: Kind, plan: &Plan) {
    let counter = match kind {
        Kind::Split => &gw.counts.split,
        Kind::Local => &gw.counts.local,
        Kind::WithoutParams => &gw.counts.without_params,
    };
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let (Kind::WithoutParams, Some(prefill)) = (kind, plan.prefill()) {
        gw.telemetry.without_params(prefill);
    }
}

/// The answer's headers: its content type, the request's id (`x-request-id`), the decode
/// target (`x-routed-worker`, `x-routed-rank`), the prompt tokens predicted cached where it
/// is prefilled (`x-predicted-cached-tokens`) and, when the prefill leg ran, the prefill
/// target (`x-prefill-worker`, `x-prefill-rank`).
fn receipt(gw: &PdGateway, legs: &Legs, plan: &Plan, prefilled: bool) -> HeaderMap {
    let mut h = HeaderMap::new();
    let kind = if legs.streamed {
        "text/event-stream"
    } else {
        "application/json"
    };
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    if let Ok(id) = HeaderValue::from_str(&legs.id) {
        h.insert(wire::REQUEST_ID, id);
    }
    let d = plan.decode();
    h.insert("x-routed-worker", HeaderValue::from(d.get()));
    h.insert("x-routed-rank", HeaderValue::from(gw.decode.rank(d)));
    h.insert(
        "x-predicted-cached-tokens",
        HeaderValue::from(plan.cached_tokens() as u64),
    );
    if let Some(p) = plan.prefill().filter(|_| prefilled) {
        h.insert("x-prefill-worker", HeaderValue::from(p.get()));
        h.insert("x-prefill-rank", HeaderValue::from(gw.prefill.rank(p)));
    }
    h
}

/// A streamed decode answer in flight: `first_token` at its first content event;
/// `complete`, and the request counted, when dropped (the stream ended or broke, or the
/// client went away).
struct Watch {
    gw: Arc<PdGateway>,
    plan: Plan,
    kind: PlanKind,
    started: Instant,
    events: Events,
    /// Whether the decode worker answered with a 2xx status.
    answered: bool,
    /// Whether its stream ended, and whether it broke on the way.
    ended: bool,
    broken: bool,
}

impl Watch {
    /// The decode worker's stream ended.
    fn end(&mut self) {
        self.ended = true;
    }

    fn chunk(&mut self, chunk: &[u8]) {
        if self.events.feed(chunk) {
            self.gw.planner.first_token(&self.plan);
            let elapsed = self.started.elapsed();
            self.gw.telemetry.first_token(self.kind, elapsed);
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let outcome = Outcome::of_stream(self.answered && !self.broken, self.ended);
        let elapsed = self.started.elapsed();
        self.gw
            .telemetry
            .finished(Some(self.kind), outcome, elapsed);
        self.gw.planner.complete(&self.plan);
    }
}

/// The client's body: the decode worker's bytes as they come, watched for the planner and
/// the metrics.
fn pass_through(
    gw: Arc<PdGateway>,
    legs: &Legs,
    plan: Plan,
    kind: PlanKind,
    upstream: reqwest::Response,
) -> Body {
    let watch = Watch {
        gw,
        plan,
        kind,
        started: legs.started,
        events: Events::default(),
        answered: upstream.status().is_success(),
        ended: false,
        broken: false,
    };
    let chunks = Box::pin(upstream.bytes_stream());
    let body =
        futures_util::stream::unfold((chunks, watch), |(mut chunks, mut watch)| async move {
            let Some(chunk) = chunks.next().await else {
                watch.end();
                return None;
            };
            match &chunk {
                Ok(bytes) => watch.chunk(bytes),
                Err(_) => watch.broken = true,
            }
            Some((chunk, (chunks, watch)))
        });
    Body::from_stream(body)
}
