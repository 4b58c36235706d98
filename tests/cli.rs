//! The command lines of `examples/simulate`, `examples/gateway` and `examples/vllm_events`:
//! their parsers, read from the examples' own source, and the example programs themselves,
//! built by the `cargo` that runs this test with the same profile and features, then run.

#![cfg(feature = "sim")]
#![allow(clippy::unwrap_used, dead_code, unreachable_pub)]

#[path = "../examples/simulate/args.rs"]
mod args;
// The examples' own name for it (their parsers say `super::cli`).
#[allow(clippy::module_inception)]
#[path = "../examples/common/cli.rs"]
mod cli;
#[path = "../examples/common/engine_settings.rs"]
mod engine_settings;
#[path = "../examples/gateway/flags.rs"]
mod flags;
#[path = "../examples/common/policy.rs"]
mod policy;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use clap::error::ErrorKind;
use prefix_router::sim::{ClusterConfig, Engine, Front, SyncMode, Workload};
use prefix_router::{EngineSettings, GroupKind};

fn simulate_args(flags: &[&str]) -> Result<args::Args, clap::Error> {
    args::parse_from(std::iter::once("simulate").chain(flags.iter().copied()))
}

fn gateway_flags(flags: &[&str]) -> Result<flags::Flags, clap::Error> {
    flags::parse_from(std::iter::once("gateway").chain(flags.iter().copied()))
}

// ---- simulate's parser ----

#[test]
fn simulate_defaults_are_the_documented_ones() {
    let a = simulate_args(&[]).unwrap();
    assert_eq!(
        a.cluster,
        ClusterConfig::default().with_engine(Engine::Batched)
    );
    assert_eq!(a.cluster.seed, 0, "the simulator's seed is 0 unless --seed");
    assert_eq!(a.seed, 42, "the workloads' seed");
    assert_eq!(a.policy, "all");
    assert_eq!(a.format, "table");
    assert_eq!(a.replicas, 1);
    assert_eq!(a.router_capacity_tokens, None);
    assert!(!a.router_speeds_known);
    assert!(!a.router_terms_told);
    assert!(!a.matrix);
    assert!(!a.matrix_profiles);
    assert_eq!(a.trace, None);
    assert_eq!(a.workload, None);
    assert_eq!((a.alpha, a.miss_weight), (None, None));
    assert_eq!((a.stall_weight, a.decode_horizon), (None, None));
    assert_eq!((a.fleet, a.faults), (None, None));
    assert_eq!((a.plot, a.requests_out), (None, None));
}

#[test]
fn simulate_every_flag_sets_its_field() {
    let a = simulate_args(&[
        "--workload",
        "agentic",
        "--policy",
        "balanced",
        "--alpha",
        "0.3",
        "--miss-weight",
        "7",
        "--stall-weight",
        "0.5",
        "--decode-horizon",
        "1000",
        "--seed",
        "9",
        "--matrix",
        "--workers",
        "3",
        "--capacity-tokens",
        "5000",
        "--block-size",
        "32",
        "--speedup",
        "2.5",
        "--engine",
        "simple",
        "--max-num-batched-tokens",
        "1024",
        "--max-num-seqs",
        "8",
        "--host-capacity-tokens",
        "20000",
        "--host-chunk-blocks",
        "4",
        "--faults",
        "1@10-20",
        "--replicas",
        "2",
        "--front",
        "random",
        "--router-capacity-tokens",
        "4000",
        "--router-speeds",
        "known",
        "--router-terms",
        "known",
        "--sync",
        "events",
        "--scrape-interval",
        "0.5",
        "--event-delay",
        "0.01",
        "--event-loss",
        "0.1",
        "--event-replay",
        "off",
        "--admission",
        "on",
        "--priorities",
        "critical:0.1,standard:0.6,sheddable:0.3",
        "--format",
        "csv",
        "--ttft-target",
        "1.5",
        "--tpot-target",
        "0.05",
        "--requests-out",
        "r.jsonl",
        "--plot",
        "p.svg",
    ])
    .unwrap();
    let c = a.cluster;
    assert_eq!(a.workload.as_deref(), Some("agentic"));
    assert_eq!(a.policy, "balanced");
    assert_eq!((a.alpha, a.miss_weight), (Some(0.3), Some(7.0)));
    assert_eq!((a.stall_weight, a.decode_horizon), (Some(0.5), Some(1_000)));
    assert_eq!((a.seed, c.seed), (9, 9), "--seed seeds both");
    assert!(a.matrix);
    assert_eq!((c.workers, c.capacity_tokens, c.block_size), (3, 5000, 32));
    assert_eq!(c.speedup, 2.5);
    assert_eq!(c.engine, Engine::Simple);
    assert_eq!(
        (
            c.batch.step.max_num_batched_tokens,
            c.batch.step.max_num_seqs
        ),
        (1024, 8)
    );
    assert_eq!(
        (c.batch.host_capacity_tokens, c.batch.host_chunk_blocks),
        (20_000, 4)
    );
    assert_eq!(a.faults.as_deref(), Some("1@10-20"));
    assert_eq!(a.replicas, 2);
    assert_eq!(c.front, Front::Random);
    assert_eq!(a.router_capacity_tokens, Some(4000));
    assert!(a.router_speeds_known);
    assert!(a.router_terms_told);
    assert_eq!(c.sync, SyncMode::Events);
    assert_eq!(
        (c.scrape_interval_s, c.event_delay_s, c.event_loss),
        (0.5, 0.01, 0.1)
    );
    assert!(!c.event_replay);
    assert!(c.admission);
    assert_eq!(c.priorities.shares, [0.3, 0.6, 0.1]);
    assert_eq!(a.format, "csv");
    assert_eq!((c.ttft_target_s, c.tpot_target_s), (1.5, 0.05));
    assert_eq!(a.requests_out.as_deref(), Some("r.jsonl"));
    assert_eq!(a.plot.as_deref(), Some("p.svg"));
}

#[test]
fn simulate_named_values() {
    let sync = |v: &str| simulate_args(&["--sync", v]).unwrap().cluster.sync;
    assert_eq!(sync("optimistic"), SyncMode::None);
    assert_eq!(sync("none"), SyncMode::None, "none is optimistic");
    assert_eq!(sync("feedback"), SyncMode::Feedback);
    let front = simulate_args(&["--front", "rr"]).unwrap().cluster.front;
    assert_eq!(front, Front::RoundRobin);
    let engine = simulate_args(&["--engine", "batched"])
        .unwrap()
        .cluster
        .engine;
    assert_eq!(engine, Engine::Batched);
    let capacity = |v: &str| simulate_args(&["--router-capacity-tokens", v]);
    assert_eq!(capacity("unknown").unwrap().router_capacity_tokens, None);
    assert_eq!(capacity("123").unwrap().router_capacity_tokens, Some(123));
    assert_eq!(
        capacity("lots").unwrap_err().kind(),
        ErrorKind::ValueValidation
    );
    let speeds = simulate_args(&["--router-speeds", "unknown"]).unwrap();
    assert!(!speeds.router_speeds_known);
    let replay = simulate_args(&["--event-replay", "on"]).unwrap();
    assert!(replay.cluster.event_replay);
    for format in ["table", "json", "csv"] {
        assert_eq!(simulate_args(&["--format", format]).unwrap().format, format);
    }
    for name in policy::POLICIES {
        assert_eq!(simulate_args(&["--policy", name]).unwrap().policy, name);
    }
    for (name, _) in Workload::builtin() {
        let a = simulate_args(&["--workload", name]).unwrap();
        assert_eq!(a.workload.as_deref(), Some(name));
    }
}

#[test]
fn simulate_fleet_sets_the_worker_count() {
    let a = simulate_args(&["--workers", "2", "--fleet", "3x1.0,2x0.5@2000000"]).unwrap();
    assert_eq!(a.cluster.workers, 5);
    assert_eq!(a.fleet.as_deref(), Some("3x1.0,2x0.5@2000000"));
}

#[test]
fn simulate_takes_a_disaggregated_fleet_and_its_deciders() {
    let a = simulate_args(&[
        "--fleet",
        "2xP,6xD",
        "--pd-decider",
        "llmd",
        "--kv-transfer-bytes-per-s",
        "1e9",
        "--kv-bytes-per-token",
        "65536",
        "--workload",
        "long-context",
        "--pd-stall-weight",
        "0.2",
        "--pd-decode-step-limit",
        "0.05",
    ])
    .unwrap();
    assert_eq!(a.pd_stall_weight, 0.2);
    assert_eq!(a.pd_decode_step_limit, Some(0.05));
    assert_eq!(simulate_args(&[]).unwrap().pd_decode_step_limit, None);
    assert_eq!(a.cluster.workers, 8);
    assert_eq!(a.pd_decider, "llmd");
    assert_eq!(a.cluster.kv_transfer_bytes_per_s, 1e9);
    assert_eq!(a.cluster.kv_bytes_per_token, 65_536);
    assert_eq!(a.workload.as_deref(), Some("long_context"));
    assert_eq!(simulate_args(&[]).unwrap().pd_decider, "all");
    let kind = |flags: &[&str]| simulate_args(flags).err().map(|e| e.kind());
    assert_eq!(
        kind(&["--pd-decider", "sometimes"]),
        Some(ErrorKind::InvalidValue)
    );
    assert_eq!(kind(&["--fleet", "2xQ"]), Some(ErrorKind::ValueValidation));
}

#[test]
fn simulate_rejects_what_it_cannot_run() {
    let kind = |flags: &[&str]| simulate_args(flags).err().map(|e| e.kind());
    assert_eq!(kind(&["--bogus"]), Some(ErrorKind::UnknownArgument));
    assert_eq!(kind(&["--workers"]), Some(ErrorKind::InvalidValue));
    assert_eq!(kind(&["--workers", "x"]), Some(ErrorKind::ValueValidation));
    assert_eq!(
        kind(&["--sync", "sometimes"]),
        Some(ErrorKind::InvalidValue)
    );
    assert_eq!(kind(&["--policy", "nosuch"]), Some(ErrorKind::InvalidValue));
    assert_eq!(kind(&["--format", "xml"]), Some(ErrorKind::InvalidValue));
    assert_eq!(
        kind(&["--workload", "nosuch"]),
        Some(ErrorKind::InvalidValue)
    );
    assert_eq!(
        kind(&["--workload", "agentic", "--trace", "t.jsonl"]),
        Some(ErrorKind::ArgumentConflict)
    );
    assert_eq!(kind(&["--replicas", "0"]), Some(ErrorKind::ValueValidation));
    assert_eq!(
        kind(&["--priorities", "standard:0.5"]),
        Some(ErrorKind::ValueValidation)
    );
    assert_eq!(
        kind(&["--admission", "maybe"]),
        Some(ErrorKind::InvalidValue)
    );
    assert_eq!(kind(&["--fleet", "4x"]), Some(ErrorKind::ValueValidation));
    assert_eq!(
        kind(&["--engine-profile", "llama-9000"]),
        Some(ErrorKind::ValueValidation)
    );
    assert_eq!(
        kind(&["--engine-profile", "no/such/profile.json"]),
        Some(ErrorKind::ValueValidation)
    );
    assert_eq!(
        kind(&["--step-jitter=-1"]),
        Some(ErrorKind::ValueValidation)
    );
    for flags in [&["--help"][..], &["-h"]] {
        let e = simulate_args(flags).unwrap_err();
        assert_eq!((e.kind(), e.exit_code()), (ErrorKind::DisplayHelp, 0));
    }
}

/// `--matrix-profiles` runs the engine-profile axis, which sets the loads and profiles
/// itself: it takes neither `--matrix`, `--load-sweep` nor `--engine-profile`.
#[test]
fn simulate_matrix_profiles_runs_alone() {
    let a = simulate_args(&["--matrix-profiles"]).unwrap();
    assert!(a.matrix_profiles && !a.matrix);
    assert_eq!(a.engine_profile, "default");
    let kind = |flags: &[&str]| simulate_args(flags).err().map(|e| e.kind());
    for other in [
        &["--matrix"][..],
        &["--load-sweep", "1,2"],
        &["--engine-profile", "llama3-8b-a100"],
    ] {
        let flags: Vec<&str> = std::iter::once("--matrix-profiles")
            .chain(other.iter().copied())
            .collect();
        assert_eq!(kind(&flags), Some(ErrorKind::ArgumentConflict), "{flags:?}");
    }
}

#[test]
fn an_error_is_one_line_without_usage() {
    let e = simulate_args(&["--worker", "3"]).unwrap_err();
    let line = cli::one_line(&e);
    assert_eq!(
        line,
        "unexpected argument '--worker' found; tip: a similar argument exists: '--workers'"
    );
    let e = simulate_args(&["--replicas", "0"]).unwrap_err();
    assert_eq!(cli::one_line(&e), "--replicas: at least 1");
}

// ---- gateway's parser ----

#[test]
fn gateway_defaults_are_the_documented_ones() {
    let f = gateway_flags(&["--upstream", "http://127.0.0.1:8001/"]).unwrap();
    assert_eq!(f.listen, "127.0.0.1:8000");
    assert_eq!(f.policy, "balanced");
    assert_eq!(
        f.upstreams,
        ["http://127.0.0.1:8001"],
        "the slash is dropped"
    );
    assert_eq!(f.options.block_size, 16);
    assert_eq!(f.options.capacity_tokens, None);
    assert_eq!(f.mock, None);
    assert_eq!(f.capacity_blocks, 65_536);
    assert_eq!(f.ranks, 1);
    assert_eq!(f.metrics_path, None);
    assert_eq!(f.scrape_interval, Duration::from_secs(1));
    assert_eq!(f.health_interval, Duration::from_secs(2));
    assert_eq!(f.request_timeout, Duration::from_secs(300));
    assert_eq!(f.drain, Duration::ZERO);
    assert_eq!((f.tokenizer, f.tokenizer_config), (None, None));
    assert_eq!(f.tokenize_cache_bytes, 64 << 20);
    assert!(f.loras.is_empty() && f.kv_events.is_empty());
    assert_eq!(f.kv_events_host, None);
    assert_eq!(f.options.host_chunk_blocks, 1);
    assert!(!f.options.full_reports);
    assert!(f.engine_settings.is_empty());
}

#[test]
fn gateway_every_flag_sets_its_field() {
    let f = gateway_flags(&[
        "--listen",
        "0.0.0.0:9000",
        "--policy",
        "cache_aware",
        "--upstream",
        "http://a:1",
        "--upstream",
        "http://b:2",
        "--block-size",
        "32",
        "--dp-ranks",
        "2",
        "--metrics-path",
        "/metrics",
        "--scrape-interval-ms",
        "250",
        "--health-interval-ms",
        "0",
        "--request-timeout-s",
        "0",
        "--drain-ms",
        "1500",
        "--tokenizer",
        "t.json",
        "--tokenizer-config",
        "tc.json",
        "--tokenize-cache-mb",
        "8",
        "--lora",
        "a",
        "--lora",
        "b",
        "--kv-events",
        "tcp://a:5557,tcp://a:5558",
        "--kv-events",
        "tcp://b:5557",
        "--host-chunk-blocks",
        "2",
        "--full-reports",
        "--engine-settings",
        "1:host-chunk-blocks=4,full-reports=false,window=1:512,mamba=2",
    ])
    .unwrap();
    assert_eq!(f.listen, "0.0.0.0:9000");
    assert_eq!(f.policy, "cache_aware");
    assert_eq!(f.upstreams, ["http://a:1", "http://b:2"]);
    assert_eq!(f.options.block_size, 32);
    assert_eq!(f.ranks, 2);
    assert_eq!(f.metrics_path.as_deref(), Some("/metrics"));
    assert_eq!(f.scrape_interval, Duration::from_millis(250));
    assert_eq!(f.health_interval, Duration::from_millis(1), "at least 1 ms");
    assert_eq!(f.request_timeout, Duration::from_secs(1), "at least 1 s");
    assert_eq!(f.drain, Duration::from_millis(1500));
    assert_eq!(f.tokenizer, Some(PathBuf::from("t.json")));
    assert_eq!(f.tokenizer_config, Some(PathBuf::from("tc.json")));
    assert_eq!(f.tokenize_cache_bytes, 8 << 20);
    assert_eq!(f.loras, ["a", "b"]);
    assert_eq!(f.kv_events, ["tcp://a:5557,tcp://a:5558", "tcp://b:5557"]);
    assert_eq!(f.options.host_chunk_blocks, 2);
    assert!(f.options.full_reports);
    let upstream1 = EngineSettings::default()
        .with_host_chunk_blocks(4)
        .with_full_reports(false)
        .with_group(1, GroupKind::SlidingWindow { tokens: 512 })
        .with_group(2, GroupKind::Mamba);
    assert_eq!(f.engine_settings.len(), 1);
    assert_eq!(
        (f.engine_settings[0].engine, &f.engine_settings[0].settings),
        (1, &upstream1)
    );

    let m = gateway_flags(&[
        "--mock-worker",
        "127.0.0.1:8001",
        "--capacity-blocks",
        "100",
        "--kv-events-host",
        "127.0.0.1",
    ])
    .unwrap();
    assert_eq!(m.mock.as_deref(), Some("127.0.0.1:8001"));
    assert_eq!(m.capacity_blocks, 100);
    assert_eq!(m.kv_events_host.as_deref(), Some("127.0.0.1"));
    assert!(m.upstreams.is_empty(), "a mock worker needs no upstream");
}

#[test]
fn gateway_rejects_what_it_cannot_serve() {
    let kind = |flags: &[&str]| gateway_flags(flags).err().map(|e| e.kind());
    assert_eq!(kind(&[]), Some(ErrorKind::MissingRequiredArgument));
    assert_eq!(
        kind(&["--upstream", "http://a", "--bogus"]),
        Some(ErrorKind::UnknownArgument)
    );
    assert_eq!(
        kind(&["--upstream", "http://a", "--policy", "nosuch"]),
        Some(ErrorKind::InvalidValue)
    );
    assert_eq!(
        kind(&["--upstream", "http://a", "--dp-ranks", "two"]),
        Some(ErrorKind::ValueValidation)
    );
    let e = gateway_flags(&["--help"]).unwrap_err();
    assert_eq!((e.kind(), e.exit_code()), (ErrorKind::DisplayHelp, 0));
    // Engine settings are for the KV events the gateway follows.
    for flags in [
        &[
            "--upstream",
            "http://a",
            "--engine-settings",
            "0:full-reports",
        ][..],
        &["--upstream", "http://a", "--host-chunk-blocks", "4"],
        &["--upstream", "http://a", "--full-reports"],
    ] {
        assert_eq!(
            kind(flags),
            Some(ErrorKind::MissingRequiredArgument),
            "{flags:?}"
        );
    }
    let events = ["--upstream", "http://a", "--kv-events", "tcp://a:1"];
    for bad in [
        "0:chunk=4",
        "full-reports",
        "0:window=0:512",
        "0:host-chunk-blocks=0",
    ] {
        let mut flags = events.to_vec();
        flags.extend(["--engine-settings", bad]);
        assert_eq!(kind(&flags), Some(ErrorKind::ValueValidation), "{bad}");
    }
    let mut flags = events.to_vec();
    flags.extend(["--host-chunk-blocks", "0"]);
    assert_eq!(kind(&flags), Some(ErrorKind::ValueValidation));
}

// ---- the programs ----

/// The example programs by name, built once for all the tests here.
fn example(name: &str) -> PathBuf {
    static BUILT: OnceLock<HashMap<String, PathBuf>> = OnceLock::new();
    let built = BUILT.get_or_init(build_examples);
    built
        .get(name)
        .unwrap_or_else(|| panic!("cargo built no example {name}: {built:?}"))
        .clone()
}

/// A `cargo` command without what cargo sets for a test it runs, which would not be set for
/// the `cargo test` that runs it: a build script that reads one (ring's reads
/// CARGO_MANIFEST_DIR) would otherwise see it change, and both builds would redo its crate
/// and all that depends on it, each time.
fn cargo_outside_test() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PKG_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
            ]
            .contains(&key.as_ref())
        {
            command.env_remove(key.as_ref());
        }
    }
    command
}

/// Builds `simulate`, `gateway` and (with the feature `vllm`) `vllm_events` with this test's
/// features and the profile `cargo test` builds examples with (`test`, or `release` under
/// `--release`), into this test's target directory, so that under `cargo test` they are
/// already fresh, and returns their paths as cargo reports them.
fn build_examples() -> HashMap<String, PathBuf> {
    let exe = std::env::current_exe().unwrap();
    // <target>/<profile>/deps/<this test>
    let target_dir = exe.ancestors().nth(3).unwrap();
    // The same set as this test's, `default` included, or cargo builds everything anew.
    let mut features = vec!["sim"];
    if cfg!(feature = "vllm") {
        features.push("vllm");
    }
    if cfg!(feature = "zmq") {
        features.push("zmq");
    }
    let defaults: &[&str] = if cfg!(feature = "default") {
        &[]
    } else {
        &["--no-default-features"]
    };
    let profile = if cfg!(debug_assertions) {
        "test"
    } else {
        "release"
    };
    let mut command = cargo_outside_test();
    let out = command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--example", "simulate", "--example", "gateway"])
        .args(if cfg!(feature = "vllm") {
            &["--example", "vllm_events"][..]
        } else {
            &[]
        })
        .args(["--profile", profile])
        .args(defaults)
        .arg("--features")
        .arg(features.join(","))
        .arg("--target-dir")
        .arg(target_dir)
        .arg("--message-format=json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo build failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter_map(|m| {
            let name = m["target"]["name"].as_str()?.to_owned();
            let path = m["executable"].as_str()?.into();
            Some((name, path))
        })
        .collect()
}

fn run(example_name: &str, flags: &[&str]) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(example(example_name))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(flags)
        .output()
        .unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (status.code().unwrap(), text(stdout), text(stderr))
}

#[test]
fn simulate_help_exits_0_and_lists_every_flag() {
    let (code, out, err) = run("simulate", &["--help"]);
    assert_eq!(code, 0, "{err}");
    for flag in [
        "--trace <PATH>",
        "--workload <NAME>",
        "--workers <N>",
        "--speedup <X>",
        "--capacity-tokens <N>",
        "--sync <SYNC>",
        "--replicas <N>",
        "--front <FRONT>",
        "--fleet <SPEC>",
        "--engine <ENGINE>",
        "--matrix",
        "--matrix-profiles",
        "--format <FORMAT>",
        "--requests-out <FILE>",
        "--router-speeds <ROUTER_SPEEDS>",
        "--router-terms <ROUTER_TERMS>",
        "--router-capacity-tokens <N|unknown>",
        "--admission <ADMISSION>",
        "--priorities <SPEC>",
        "--engine-profile <NAME|FILE.json>",
        "--step-jitter <SIGMA>",
        "--load-sweep <X,X,...>",
    ] {
        assert!(out.contains(flag), "{flag} not in:\n{out}");
    }
    for (name, _) in Workload::builtin() {
        assert!(out.contains(name), "workload {name} not in:\n{out}");
    }
}

#[test]
fn simulate_unknown_flag_exits_2_naming_it() {
    let (code, out, err) = run("simulate", &["--no-such-flag"]);
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert_eq!(
        err, "error: unexpected argument '--no-such-flag' found\n",
        "one line"
    );
}

#[test]
fn simulate_unknown_workload_exits_2_naming_the_valid_ones() {
    let (code, _, err) = run("simulate", &["--workload", "nosuch"]);
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("'nosuch'"), "{err}");
    for (name, _) in Workload::builtin() {
        assert!(err.contains(name), "workload {name} not in: {err}");
    }
}

/// An engine profile by name or from a file; a bad file is a one-line error, exit 2.
#[test]
fn simulate_engine_profiles_from_names_and_files() {
    let a = simulate_args(&["--engine-profile", "llama3-8b-a100", "--step-jitter", "0.2"]).unwrap();
    let profile = a.cluster.batch.profile.expect("a profile");
    assert_eq!(profile.base_s, 9.7e-3);
    assert_eq!(a.cluster.batch.step_jitter, 0.2);
    assert_eq!(a.engine_profile, "llama3-8b-a100");
    let d = simulate_args(&[]).unwrap();
    assert_eq!(
        d.cluster.batch.profile, None,
        "default: the router's own step model"
    );
    let dir = std::env::temp_dir().join(format!("engine-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("lab.json");
    std::fs::write(
        &good,
        r#"{"name": "lab", "source": "a bench", "base_s": 0.01}"#,
    )
    .unwrap();
    let a = simulate_args(&["--engine-profile", good.to_str().unwrap()]).unwrap();
    assert_eq!(a.cluster.batch.profile.unwrap().base_s, 0.01);
    assert_eq!(a.engine_profile, "lab");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"name": "x", "source": "y", "speed": 2}"#).unwrap();
    let (code, out, err) = run("simulate", &["--engine-profile", bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("speed"), "names the unknown key: {err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--router-terms known` configures the routers with the engine profile's terms: the
/// prefill rate, a step's fixed time (the base, or the floor where longer), per decode and
/// per context token; the rest of the step model, and everything without the flag or
/// without a profile, as configured.
#[test]
fn simulate_router_terms_are_the_engine_profile_s_when_known() {
    let (rate, step) = simulate_args(&[]).unwrap().router_terms();
    let unknown = simulate_args(&["--engine-profile", "llama3-8b-a100"]).unwrap();
    assert_eq!(
        unknown.router_terms(),
        (rate, step),
        "learned from the defaults"
    );
    let no_profile = simulate_args(&["--router-terms", "known"]).unwrap();
    assert_eq!(
        no_profile.router_terms(),
        (rate, step),
        "default: the router's own"
    );
    let known = [
        "--engine-profile",
        "llama3-8b-a100",
        "--router-terms",
        "known",
    ];
    let (told_rate, told) = simulate_args(&known).unwrap().router_terms();
    assert!((told_rate - 1.0 / 8.35e-5).abs() < 1e-6, "{told_rate}");
    assert_eq!(told.step_base_s, 9.7e-3);
    assert_eq!(told.step_s_per_decode, 4.06e-5);
    assert_eq!(told.step_s_per_context_token, 8.34e-8);
    assert_eq!(told.max_num_batched_tokens, step.max_num_batched_tokens);
    assert_eq!(told.max_num_seqs, step.max_num_seqs);
    let mocker = [
        "--engine-profile",
        "dynamo-mocker",
        "--router-terms",
        "known",
        "--capacity-tokens",
        "1048576",
    ];
    let (mocker_rate, mocker) = simulate_args(&mocker).unwrap().router_terms();
    assert!(
        (mocker_rate - 1.0 / 1.518_344e-5).abs() < 1e-6,
        "{mocker_rate}"
    );
    assert_eq!(mocker.step_base_s, 5.74e-3, "a decode step's fixed time");
    assert_eq!(
        mocker.step_s_per_context_token,
        54.01e-3 / 1_048_576.0,
        "the usage curve's slope at 0, per token of the fleet's capacity"
    );
    let dir = std::env::temp_dir().join(format!("router-terms-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let floored = dir.join("floored.json");
    std::fs::write(
        &floored,
        r#"{"name": "floored", "source": "a bench", "floor_s": 0.02, "base_s": 0.01}"#,
    )
    .unwrap();
    let file = floored.to_str().unwrap();
    let (floored_rate, floored) =
        simulate_args(&["--engine-profile", file, "--router-terms", "known"])
            .unwrap()
            .router_terms();
    assert_eq!(floored.step_base_s, 0.02, "the floor, longer than the base");
    assert_eq!(floored_rate, rate, "no prefill term: the configured rate");
    assert_eq!(floored.step_s_per_decode, 0.0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn simulate_bad_value_exits_2_on_one_line() {
    let (code, _, err) = run("simulate", &["--workers", "eight"]);
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: invalid value 'eight' for '--workers <N>'"));
}

#[test]
fn simulate_runs_one_workload_with_plain_progress_off_a_terminal() {
    let (code, out, err) = run(
        "simulate",
        &[
            "--workload",
            "agentic",
            "--policy",
            "round_robin",
            "--format",
            "json",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.len(), 1, "one workload, one policy: {out}");
    assert_eq!(rows[0]["workload"], "agentic");
    assert_eq!(rows[0]["policy"], "round_robin");
    let (_, agentic) = Workload::builtin()
        .into_iter()
        .find(|(name, _)| *name == "agentic")
        .unwrap();
    assert_eq!(rows[0]["requests"], agentic.generate(42).len());
    // stderr is a pipe here: no bar is drawn, only the finished policy's line.
    assert_eq!(err, "[ 1/1] agentic: round_robin\n");
}

#[test]
fn gateway_help_exits_0_and_bad_flags_exit_2() {
    let (code, out, err) = run("gateway", &["--help"]);
    assert_eq!(code, 0, "{err}");
    for flag in [
        "--upstream <URL>",
        "--mock-worker <ADDR>",
        "--policy <NAME>",
    ] {
        assert!(out.contains(flag), "{flag} not in:\n{out}");
    }
    let (code, _, err) = run("gateway", &["--upstream", "http://127.0.0.1:1", "--nope"]);
    assert_eq!(code, 2);
    assert_eq!(err, "error: unexpected argument '--nope' found\n");
    let (code, _, err) = run("gateway", &[]);
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--upstream"), "{err}");
}

#[test]
fn gateway_engine_settings_need_kv_events() {
    let (code, _, err) = run(
        "gateway",
        &[
            "--upstream",
            "http://127.0.0.1:1",
            "--engine-settings",
            "0:full-reports",
        ],
    );
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--kv-events"), "{err}");
}

// ---- vllm_events ----

/// The test vectors of vLLM 0.33: batch 0 stores group 0's blocks and, in group 1, a block
/// stating a sliding window of 512 tokens.
#[cfg(feature = "vllm")]
const V033: &str = "tests/data/vllm/v033_map_u64";

#[cfg(feature = "vllm")]
#[test]
fn vllm_events_help_exits_0_and_lists_every_flag() {
    let (code, out, err) = run("vllm_events", &["--help"]);
    assert_eq!(code, 0, "{err}");
    for flag in [
        "[[WORKER=]PAYLOAD_FILE]...",
        "--zmq <[WORKER=]ENDPOINT>",
        "--replay <[WORKER=]ENDPOINT>",
        "--topic <TOPIC>",
        "--batches <N>",
        "--block-size <N>",
        "--host-chunk-blocks <B>",
        "--full-reports",
        "--engine-settings <N:SETTINGS>",
        "window=G:TOKENS",
    ] {
        assert!(out.contains(flag), "{flag} not in:\n{out}");
    }
}

#[cfg(feature = "vllm")]
#[test]
fn vllm_events_bad_flags_exit_2_on_one_line() {
    let file = format!("{V033}/batch_00.msgpack");
    for (flags, says) in [
        (&["--nope", "x"][..], "unexpected argument '--nope'"),
        (&[], "required arguments were not provided"),
        (&["--batches", "2", "x"], "cannot be used with"),
        (
            &["--engine-settings", "0:chunk=4", "x"],
            "unknown setting \"chunk=4\"",
        ),
        (&["--block-size", "many", "x"], "invalid value 'many'"),
        (
            &["--engine-settings", "3:full-reports", &file],
            "there is no worker 3",
        ),
        (&["two=x"], "the worker before '=' must be a number"),
    ] {
        let (code, out, err) = run("vllm_events", flags);
        assert_eq!(code, 2, "{flags:?}: {out}{err}");
        assert_eq!(err.lines().count(), 1, "{flags:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(says),
            "{flags:?}: {err}"
        );
    }
}

#[cfg(all(feature = "vllm", not(feature = "zmq")))]
#[test]
fn vllm_events_live_mode_needs_the_zmq_feature() {
    let (code, _, err) = run("vllm_events", &["--zmq", "tcp://127.0.0.1:1"]);
    assert_eq!(code, 2);
    assert!(err.contains("needs the `zmq` feature"), "{err}");
}

/// The defaults and one worker's settings are printed at start as the mirror has them in
/// effect (read back from it), each worker with its own.
#[cfg(feature = "vllm")]
#[test]
fn vllm_events_applies_each_workers_settings_and_says_them() {
    let batch = format!("{V033}/batch_00.msgpack");
    let (w0, w1) = (format!("0={batch}"), format!("1={batch}"));
    let (code, out, err) = run(
        "vllm_events",
        &[
            "--host-chunk-blocks",
            "2",
            "--engine-settings",
            "1:host-chunk-blocks=4,full-reports,window=1:512",
            &w0,
            &w1,
        ],
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..3],
        [
            "block size 16 tokens, every engine",
            "worker 0: assuming host-chunk-blocks=2,full-reports=false (the defaults)",
            "worker 1: assuming host-chunk-blocks=4,full-reports=true,window=1:512 \
             (--engine-settings 1:host-chunk-blocks=4,full-reports=true,window=1:512, the \
             rest by default)",
        ]
    );
    assert!(
        lines.contains(
            &"worker 1 seq 0: BlockStored: stored 1, removed 0, duplicates 0, unknown parent 0"
        ),
        "{out}"
    );
    assert!(!out.contains("conflict"), "{out}");
}

/// A window the events state against the one given is followed and reported, on the event's
/// line and at the end; the same window as given is no conflict.
#[cfg(feature = "vllm")]
#[test]
fn vllm_events_reports_events_that_contradict_a_workers_settings() {
    let batch = format!("{V033}/batch_00.msgpack");
    let (code, out, err) = run(
        "vllm_events",
        &["--engine-settings", "0:window=1:1024", &batch],
    );
    assert_eq!(code, 0, "{err}");
    let conflicts: Vec<&str> = out.lines().filter(|l| l.contains("conflict")).collect();
    assert_eq!(
        conflicts,
        [
            "worker 0 seq 0: settings conflict: the engine's event contradicts what \
             --engine-settings 0:window=1:1024 says; the event is followed, the mirror now \
             assumes host-chunk-blocks=1,full-reports=false,window=1:512",
            "worker 0: 1 settings conflict: its engine runs otherwise than --engine-settings \
             0:window=1:1024 says; the mirror now assumes \
             host-chunk-blocks=1,full-reports=false,window=1:512",
        ],
        "{out}"
    );
    let (code, out, err) = run(
        "vllm_events",
        &["--engine-settings", "0:window=1:512", &batch],
    );
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("conflict"), "{out}");
}
