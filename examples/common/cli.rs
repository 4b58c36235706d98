//! What the examples do when their command line does not parse, shared by the examples.

use std::process::ExitCode;

/// Ends a parse that `e` stopped: `--help` (and `--version`) print what clap prints, on
/// stdout, with exit code 0; any other error prints `error: ` and [`one_line`] on stderr,
/// with exit code 2.
pub(crate) fn exit(e: &clap::Error) -> ExitCode {
    if e.exit_code() == 0 {
        // A closed stdout leaves nothing to tell.
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    eprintln!("error: {}", one_line(e));
    ExitCode::from(2)
}

/// clap's message for `e` on one line, without styling, without the `error: ` it starts
/// with and without the usage and `--help` paragraphs. A paragraph's further lines (the
/// possible values) follow on the same line; further paragraphs (a tip) after a `; `.
pub(crate) fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let paragraphs: Vec<String> = text
        .split("\n\n")
        .filter(|p| {
            let p = p.trim_start();
            !p.starts_with("Usage:") && !p.starts_with("For more information")
        })
        .map(|p| {
            let lines: Vec<&str> = p.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
            lines.join(" ")
        })
        .filter(|p| !p.is_empty())
        .collect();
    let line = paragraphs.join("; ");
    line.strip_prefix("error: ").unwrap_or(&line).to_owned()
}
