//! A request as Python gives it (keyword arguments), owned so that routing can run with the
//! GIL released, and turned into the crate's `RouteRequest`.

use std::time::Duration;

use prefix_router::{Priority, RouteRequest, TokenId, namespace_salt};
use pyo3::prelude::*;

use crate::config::{invalid, renamed, seconds};
use crate::errors::OrRaise;

/// Everything `route()` was asked, owned.
pub(crate) struct Ask {
    pub(crate) tokens: Vec<TokenId>,
    salt: Vec<u8>,
    session: Option<String>,
    ttft_target: Option<Duration>,
    tpot_target: Option<Duration>,
    priority: Option<Priority>,
    expected_output: Option<u32>,
    now: Option<Duration>,
}

/// The keyword arguments `route()` takes beside the tokens.
pub(crate) struct AskArgs<'a> {
    pub(crate) salt: Option<Vec<u8>>,
    pub(crate) lora: Option<&'a str>,
    pub(crate) cache_salt: Option<&'a str>,
    pub(crate) session: Option<String>,
    /// Under its name in seconds, and under the former name.
    pub(crate) ttft_target: (Option<f64>, Option<f64>),
    /// Under its name in seconds, and under the former name.
    pub(crate) tpot_target: (Option<f64>, Option<f64>),
    pub(crate) priority: Option<&'a str>,
    pub(crate) expected_output: Option<u32>,
    /// Under its name in seconds, and under the former name.
    pub(crate) now: (Option<f64>, Option<f64>),
}

impl Ask {
    /// Checks and owns a request's arguments.
    pub(crate) fn new(tokens: &Bound<'_, PyAny>, args: AskArgs<'_>) -> PyResult<Self> {
        let py = tokens.py();
        let (ttft, tpot, now) = (args.ttft_target, args.tpot_target, args.now);
        let ttft_target = renamed(py, ("ttft_target_s", ttft.0), ("ttft_target", ttft.1))?;
        let tpot_target = renamed(py, ("tpot_target_s", tpot.0), ("tpot_target", tpot.1))?;
        let now = renamed(py, ("now_s", now.0), ("now", now.1))?;
        Ok(Self {
            tokens: crate::tokens::extract(tokens)?,
            salt: salt(args.salt, args.lora, args.cache_salt)?,
            session: args.session,
            ttft_target: ttft_target
                .map(|t| target("ttft_target_s", t))
                .transpose()?,
            tpot_target: tpot_target
                .map(|t| target("tpot_target_s", t))
                .transpose()?,
            priority: args
                .priority
                .map(|p| Priority::parse(p).or_raise())
                .transpose()?,
            expected_output: args.expected_output,
            now: Some(match now {
                Some(t) => seconds("now_s", t)?,
                None => monotonic(py)?,
            }),
        })
    }

    /// The crate's request.
    pub(crate) fn request(&self) -> RouteRequest<'_> {
        let mut r = RouteRequest::new(&self.tokens).with_salt(&self.salt);
        if let Some(s) = &self.session {
            r = r.with_session(s);
        }
        if let Some(t) = self.ttft_target {
            r = r.with_ttft_target(t);
        }
        if let Some(t) = self.tpot_target {
            r = r.with_tpot_target(t);
        }
        if let Some(p) = self.priority {
            r = r.with_priority(p);
        }
        if let Some(n) = self.expected_output {
            r = r.with_expected_output(n);
        }
        if let Some(t) = self.now {
            r = r.with_time(t);
        }
        r
    }
}

/// Python's `time.monotonic()`: the clock a request given no `now` is routed at, the one
/// a host passing its own should use too (the router's clock never goes back, and a time
/// far ahead of it moves it only once a second one confirms it).
fn monotonic(py: Python<'_>) -> PyResult<Duration> {
    let now: f64 = py
        .import("time")?
        .getattr("monotonic")?
        .call0()?
        .extract()?;
    seconds("now", now)
}

/// A target: a positive number of seconds.
fn target(field: &'static str, s: f64) -> PyResult<Duration> {
    if s.is_finite() && s > 0.0 {
        seconds(field, s)
    } else {
        Err(invalid(field, &s.to_string(), "seconds, above 0"))
    }
}

/// The hash salt: raw bytes, or vLLM's LoRA name and cache salt (never both).
pub(crate) fn salt(
    raw: Option<Vec<u8>>,
    lora: Option<&str>,
    cache_salt: Option<&str>,
) -> PyResult<Vec<u8>> {
    match raw {
        Some(_) if lora.is_some() || cache_salt.is_some() => Err(invalid(
            "salt",
            "given with lora or cache_salt",
            "either raw salt bytes, or lora and cache_salt (mapped as vLLM's events are)",
        )),
        Some(bytes) => Ok(bytes),
        None => Ok(namespace_salt(lora, cache_salt)),
    }
}
