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
//! leg fails.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use prefix_router::{Error, WorkerId};
use serde_json::{Map, Value};

use super::app::{Incoming, error, shed_response};
use super::pd::PdGateway;
use super::pd_plan::{Plan, Role};
use super::pd_wire as wire;
use super::prompt::Endpoint;
use super::stream::Events;

/// What both legs of a request share.
struct Legs {
    endpoint: Endpoint,
    /// `X-Request-Id` on both legs.
    id: String,
    /// The client's body.
    body: Map<String, Value>,
    streamed: bool,
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
    let read = Incoming::read(
        gw.prompts.as_deref(),
        &gw.loras,
        endpoint,
        &headers,
        body.clone(),
    );
    let incoming = match read {
        Ok(i) => i,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let Ok(Value::Object(client_body)) = serde_json::from_slice(&body) else {
        return error(StatusCode::BAD_REQUEST, "the body must be a JSON object");
    };
    let legs = Legs {
        endpoint,
        id: wire::request_id(&headers),
        body: client_body,
        streamed: incoming.streamed,
    };
    let request = incoming.route_request().with_time(gw.clock());
    for _ in 0..ATTEMPTS {
        let plan = match gw.planner.plan(&request) {
            Ok(plan) => plan,
            Err(Error::NoWorkers) => {
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "no decode worker is available: every decode worker is down or draining",
                );
            }
            Err(Error::Shed(shed)) => return shed_response(&shed),
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        };
        if let Some(response) = serve(&gw, &legs, plan).await {
            return response;
        }
    }
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "no planned worker could be reached in {ATTEMPTS} plans; each is out of planning \
             until its health probe answers"
        ),
    )
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
            gw.prefill.failed(prefill);
            gw.planner.set_available(Role::Prefill, prefill, false);
            gw.planner.complete(&plan);
            return None;
        }
        Prefilled::Failed(response) => {
            gw.counts
                .prefill_failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
            gw.decode.failed(t);
            gw.planner.set_available(Role::Decode, t, false);
            gw.planner.complete(&plan);
            return None;
        }
        Err(_) | Ok(Err(_)) => {
            gw.planner.complete(&plan);
            return Some(decode_timeout(gw));
        }
    };
    count(gw, kind);
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers = receipt(gw, legs, &plan, !matches!(kind, Kind::Local));
    if legs.streamed {
        let body = pass_through(Arc::clone(gw), plan, answer);
        return Some((status, headers, body).into_response());
    }
    let bytes = answer.bytes().await;
    if bytes.is_ok() && status.is_success() {
        gw.planner.first_token(&plan);
    }
    gw.planner.complete(&plan);
    Some(match bytes {
        Ok(bytes) => (status, headers, bytes).into_response(),
        Err(e) if e.is_timeout() => decode_timeout(gw),
        Err(e) => error(
            StatusCode::BAD_GATEWAY,
            format!("the decode worker broke off its answer: {e}"),
        ),
    })
}

fn decode_timeout(gw: &PdGateway) -> Response {
    let message = format!(
        "the decode worker did not answer within the gateway's request timeout ({} s)",
        gw.request_timeout.as_secs_f64()
    );
    error(StatusCode::GATEWAY_TIMEOUT, message)
}

fn count(gw: &PdGateway, kind: Kind) {
    let counter = match kind {
        Kind::Split => &gw.counts.split,
        Kind::Local => &gw.counts.local,
        Kind::WithoutParams => &gw.counts.without_params,
    };
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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

/// A streamed decode answer in flight: `first_token` at its first content event,
/// `complete` when dropped (the stream ended or broke, or the client went away).
struct Watch {
    gw: Arc<PdGateway>,
    plan: Plan,
    events: Events,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.gw.planner.complete(&self.plan);
    }
}

/// The client's body: the decode worker's bytes as they come, watched for the planner.
fn pass_through(gw: Arc<PdGateway>, plan: Plan, upstream: reqwest::Response) -> Body {
    let watch = Watch {
        gw,
        plan,
        events: Events::default(),
    };
    let chunks = Box::pin(upstream.bytes_stream());
    let body =
        futures_util::stream::unfold((chunks, watch), |(mut chunks, mut watch)| async move {
            let chunk = chunks.next().await?;
            let first = chunk.as_ref().is_ok_and(|bytes| watch.events.feed(bytes));
            if first {
                watch.gw.planner.first_token(&watch.plan);
            }
            Some((chunk, (chunks, watch)))
        });
    Body::from_stream(body)
}
