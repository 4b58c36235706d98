//! The Python package (`bindings/python/`) against the real things, from the repository's
//! test command: its wheel is built with maturin and installed into a fresh virtual
//! environment (`bindings/python/setup.sh`), then pytest runs its tests there with vLLM's
//! own event publisher's recorded runs (`tests/conformance/run.sh`) and two of the
//! repository's mock workers, which the gateway example written in Python fronts for the
//! official OpenAI client. A failed build, install or test fails this test; nothing is
//! skipped.

use std::path::Path;
use std::process::Command;

use super::fleet::*;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_package_passes_its_tests_against_its_built_wheel() {
    let python = tokio::task::spawn_blocking(|| setup("bindings/python/setup.sh"))
        .await
        .unwrap();
    let recorded = tokio::task::spawn_blocking(|| setup("tests/conformance/run.sh"))
        .await
        .unwrap();
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
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", &tests])
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
