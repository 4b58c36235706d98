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
//! the `X-data-parallel-rank` header (mock workers take the same flag).

use std::process::ExitCode;

use prefix_router::RankLayout;

mod app;
mod mock;
#[path = "../common/policy.rs"]
mod policy;
mod stream;

fn usage() -> String {
    format!(
        "usage: gateway [--listen ADDR] [--policy {}] [--block-size N] [--dp-ranks N] --upstream URL...\n       \
         gateway --mock-worker ADDR [--capacity-blocks N] [--dp-ranks N]",
        policy::POLICIES.join("|")
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut listen = "127.0.0.1:8000".to_owned();
    let mut policy_name = "balanced".to_owned();
    let mut upstreams = Vec::new();
    let mut options = policy::PolicyOptions::default();
    let mut mock_addr = None;
    let mut capacity_blocks = 65_536;
    let mut ranks = 1;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let Some(value) = args.next() else {
            eprintln!("error: {flag} needs a value\n{}", usage());
            return ExitCode::from(2);
        };
        match flag.as_str() {
            "--listen" => listen = value,
            "--policy" => policy_name = value,
            "--upstream" => upstreams.push(value.trim_end_matches('/').to_owned()),
            "--mock-worker" => mock_addr = Some(value),
            "--block-size" | "--capacity-blocks" | "--dp-ranks" => {
                let Ok(n) = value.parse::<usize>() else {
                    eprintln!("error: {flag}: {value:?} is not a number");
                    return ExitCode::from(2);
                };
                match flag.as_str() {
                    "--block-size" => options.block_size = n,
                    "--capacity-blocks" => capacity_blocks = n,
                    _ => ranks = u32::try_from(n).unwrap_or(u32::MAX),
                }
            }
            _ => {
                eprintln!("error: unknown flag {flag:?}\n{}", usage());
                return ExitCode::from(2);
            }
        }
    }
    let layout = match RankLayout::new(ranks) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: --dp-ranks: {e}");
            return ExitCode::from(2);
        }
    };
    let (addr, app) = if let Some(addr) = mock_addr {
        (
            addr,
            mock::mock_app(mock::MockWorker::new(capacity_blocks, ranks)),
        )
    } else {
        if upstreams.is_empty() {
            eprintln!("error: give at least one --upstream\n{}", usage());
            return ExitCode::from(2);
        }
        let targets = layout.targets(upstreams.len() as u32);
        let router = match policy::build(&policy_name, targets, &options) {
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
            None => {
                eprintln!("error: unknown policy {policy_name:?}\n{}", usage());
                return ExitCode::from(2);
            }
        };
        (
            listen,
            app::app(app::Gateway::new(router, upstreams, layout)),
        )
    };
    let listener = match tokio::net::TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {addr}: {e}");
            return ExitCode::from(1);
        }
    };
    eprintln!("listening on {addr}");
    if let Err(e) = axum::serve(listener, app).await {
        eprintln!("error: {e}");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
