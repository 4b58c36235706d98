//! Hostile traffic: 1,000,000 unique random 2,048-token prompts through a `BalancedRouter`
//! with its default configuration. Prints the mirror's `memory_bytes()` as it goes and the
//! process's peak resident memory at the end.
//!
//! Run: `cargo run --release --example memory_bound [PROMPTS]`

use prefix_router::{BalancedRouter, RouteRequest, Router};

fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn main() {
    let prompts: u64 = match std::env::args().nth(1).map(|a| a.parse()) {
        None => 1_000_000,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            eprintln!("error: PROMPTS must be a number");
            std::process::exit(2);
        }
    };
    let router = match BalancedRouter::new(8) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let baseline = peak_rss_bytes().unwrap_or(0);
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut tokens = vec![0u32; 2_048];
    let mut max_memory = 0;
    for i in 0..prompts {
        for t in &mut tokens {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *t = (state % 151_936) as u32;
        }
        match router.route(&RouteRequest::new(&tokens)) {
            Ok(d) => {
                router.first_token(&d);
                router.complete(&d);
            }
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        if i % 10_000 == 0 || i + 1 == prompts {
            let m = router.index().memory_bytes();
            max_memory = max_memory.max(m);
            if i % 100_000 == 0 {
                eprintln!(
                    "{i:>9} prompts: memory_bytes {:.1} MiB",
                    m as f64 / 1048576.0
                );
            }
        }
    }
    let blocks = router.index().with_tree(|t| t.block_count());
    let nodes = router.index().with_tree(|t| t.node_count());
    println!(
        "{prompts} prompts: mirror holds {blocks} blocks in {nodes} nodes; memory_bytes max {:.1} MiB; peak RSS {:.1} MiB (before routing {:.1} MiB)",
        max_memory as f64 / 1048576.0,
        peak_rss_bytes().unwrap_or(0) as f64 / 1048576.0,
        baseline as f64 / 1048576.0
    );
}
