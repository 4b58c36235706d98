//! An OpenAI-compatible gateway that routes `POST /v1/completions` with `prefix_router`.
//!
//! ```sh
//! # three mock workers with their own prefix caches, then the gateway in front of them
//! cargo run --release --example gateway -- --mock-worker 127.0.0.1:8001 &
//! cargo run --release --example gateway -- --mock-worker 127.0.0.1:8002 &
//! cargo run --release --example gateway -- --mock-worker 127.0.0.1:8003 &
//! cargo run --release --example gateway -- --listen 127.0.0.1:8000 --policy balanced \
//!     --upstream http://127.0.0.1:8001 --upstream http://127.0.0.1:8002 --upstream http://127.0.0.1:8003
//! curl -s localhost:8000/v1/completions -d '{"model":"m","prompt":[1,2,3]}'
//! curl -sN localhost:8000/v1/completions -d '{"model":"m","prompt":[1,2,3],"stream":true}'
//! curl -s localhost:8000/stats
//! ```
//!
//! Point `--upstream` at vLLM or SGLang servers (started with prefix caching, reporting
//! `usage.prompt_tokens_details.cached_tokens`) to route real traffic. With `--dp-ranks N`
//! each upstream is an endpoint of N data-parallel ranks (vLLM's `--data-parallel-size`):
//! every (endpoint, rank) is a routing target, and the gateway names the rank it chose in
//! the `X-data-parallel-rank` header (mock workers take the same flag). With
//! `--metrics-path /metrics` each upstream's Prometheus metrics are read every
//! `--scrape-interval-ms` (default 1000) into the router's load reports. Ctrl-C stops
//! accepting requests and lets those in flight, streams included, finish.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use prefix_router::RankLayout;

mod app;
mod metrics;
mod mock;
#[path = "../common/policy.rs"]
mod policy;
mod stream;

fn usage() -> String {
    format!(
        "usage: gateway [--listen ADDR] [--policy {}] [--block-size N] [--dp-ranks N] \
         [--metrics-path PATH] [--scrape-interval-ms N] --upstream URL...\n       \
         gateway --mock-worker ADDR [--capacity-blocks N] [--dp-ranks N]",
        policy::POLICIES.join("|")
    )
}

/// What the flags say.
struct Flags {
    listen: String,
    policy: String,
    upstreams: Vec<String>,
    options: policy::PolicyOptions,
    mock: Option<String>,
    capacity_blocks: usize,
    ranks: u32,
    /// Each upstream's metrics path (for example `/metrics`), scraped when given.
    metrics_path: Option<String>,
    scrape_interval: Duration,
}

fn parse_flags() -> Result<Flags, String> {
    let mut f = Flags {
        listen: "127.0.0.1:8000".to_owned(),
        policy: "balanced".to_owned(),
        upstreams: Vec::new(),
        options: policy::PolicyOptions::default(),
        mock: None,
        capacity_blocks: 65_536,
        ranks: 1,
        metrics_path: None,
        scrape_interval: Duration::from_secs(1),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{}", usage()))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag}: {value:?} is not a number"))
        };
        match flag.as_str() {
            "--listen" => f.listen = value,
            "--policy" => f.policy = value,
            "--upstream" => f.upstreams.push(value.trim_end_matches('/').to_owned()),
            "--mock-worker" => f.mock = Some(value),
            "--metrics-path" => f.metrics_path = Some(value),
            "--block-size" => f.options.block_size = number()?,
            "--capacity-blocks" => f.capacity_blocks = number()?,
            "--dp-ranks" => f.ranks = u32::try_from(number()?).unwrap_or(u32::MAX),
            "--scrape-interval-ms" => {
                f.scrape_interval = Duration::from_millis(number()?.max(1) as u64);
            }
            _ => return Err(format!("unknown flag {flag:?}\n{}", usage())),
        }
    }
    Ok(f)
}

/// The gateway's app for `f`, its metrics scraper started when asked.
fn gateway(f: Flags, layout: RankLayout) -> Result<axum::Router, String> {
    if f.upstreams.is_empty() {
        return Err(format!("give at least one --upstream\n{}", usage()));
    }
    let targets = layout.targets(f.upstreams.len() as u32);
    let router = match policy::build(&f.policy, targets, &f.options) {
        Some(r) => r.map_err(|e| e.to_string())?,
        None => return Err(format!("unknown policy {:?}\n{}", f.policy, usage())),
    };
    let gw = app::Gateway::new(router, f.upstreams, layout);
    if let Some(path) = f.metrics_path {
        tokio::spawn(metrics::scrape_forever(
            Arc::clone(&gw),
            path,
            f.scrape_interval,
        ));
    }
    Ok(app::app(gw))
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = match parse_flags() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let layout = match RankLayout::new(flags.ranks) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: --dp-ranks: {e}");
            return ExitCode::from(2);
        }
    };
    let (addr, app) = match &flags.mock {
        Some(addr) => (
            addr.clone(),
            mock::mock_app(mock::MockWorker::new(flags.capacity_blocks, flags.ranks)),
        ),
        None => {
            let listen = flags.listen.clone();
            match gateway(flags, layout) {
                Ok(app) => (listen, app),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            }
        }
    };
    let listener = match tokio::net::TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {addr}: {e}");
            return ExitCode::from(1);
        }
    };
    eprintln!("listening on {addr}");
    // On Ctrl-C, stop accepting and let the requests in flight, streams included, finish.
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        eprintln!("error: {e}");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
