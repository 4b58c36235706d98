//! The Python package (`bindings/python/`) against the real things, from the repository's
//! test command: its wheel is built with maturin and installed into a fresh virtual
//! environment (`bindings/python/setup.sh`, which keeps one holding the same wheel), then
//! pytest runs its tests there with vLLM's own event publisher's recorded runs
//! (`tests/conformance/run.sh`) and two of the repository's mock workers, which the gateway
//! example written in Python fronts for the official OpenAI client. A failed build, install
//! or test fails these tests; nothing is skipped. Two tests split the pytest tests between
//! them, so that the one that takes a minute runs beside the rest.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use super::fleet::*;

/// The one pytest test that drives the gateway for a minute: run by a test of its own, on
/// mocks of its own, beside the rest (it mostly waits).
const MINUTE_TEST: &str = "test_admission_sees_time_pass_serving_then_refusing";

/// Runs a setup script and returns the last line it printed (a path).
fn setup(script: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let out = Command::new("bash").arg(&path).output().unwrap();
    assert!(
        out.status.success(),
        "{script} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    stdout.lines().last().unwrap_or_default().trim().to_owned()
}

/// The package's environment's python and vLLM's recorded runs, set up once for both tests
/// (the second to ask waits for the first).
fn environment() -> &'static (String, String) {
    static ENVIRONMENT: OnceLock<(String, String)> = OnceLock::new();
    ENVIRONMENT.get_or_init(|| {
        (
            setup("bindings/python/setup.sh"),
            setup("tests/conformance/run.sh"),
        )
    })
}

/// Runs the package's pytest tests that `-k` `selection` picks, against two mocks of their
/// own, and fails unless they all pass and at least one ran.
async fn pytest(selection: String) {
    let (python, recorded) = tokio::task::spawn_blocking(environment)
        .await
        .unwrap()
        .clone();
    let prompts = test_prompts();
    let ups: Vec<Upstream> = (0..2)
        .map(|_| Upstream::with_prompts(4_096, &prompts))
        .collect();
    let urls: Vec<String> = ups.iter().map(|u| u.url.clone()).collect();
    let root = env!("CARGO_MANIFEST_DIR");
    let tests = format!("{root}/bindings/python/tests");
    let out = tokio::task::spawn_blocking(move || {
        // From the tests' directory: the package's source directory on `sys.path` would
        // shadow the installed wheel.
        Command::new(python)
            .current_dir(&tests)
            .args([
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-k",
                &selection,
            ])
            .arg(&tests)
            .env("PREFIX_ROUTER_CONFORMANCE_OUT", recorded)
            .env("PREFIX_ROUTER_MOCK_URLS", urls.join(","))
            .env(
                "PREFIX_ROUTER_TOKENIZER_DIR",
                format!("{root}/tests/data/tokenizer/bytelevel"),
            )
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("pytest:\n{stdout}\n{stderr}");
    assert!(out.status.success(), "pytest failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains(" passed"), "pytest ran no test:\n{stdout}");
    drop(ups);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_package_passes_its_tests_against_its_built_wheel() {
    pytest(format!("not {MINUTE_TEST}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_gateway_example_admits_for_a_minute_then_refuses() {
    pytest(MINUTE_TEST.to_owned()).await;
}
