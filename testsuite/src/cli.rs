//! What the suite's programs (msgr-stress, msgr-fanin) share around a run.

use std::process::ExitCode;

use serde::Serialize;

/// Logs to stderr (beside progress lines) when, and only when, `RUST_LOG`
/// asks for them.
pub fn init_logging() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// Prints a run's report (pretty JSON on stdout with `json`, else
/// `summary`) and returns its exit code: failure, saying `failed` on
/// stderr, when it did not pass.
pub fn finish<R: Serialize>(
    report: &R,
    summary: impl FnOnce() -> String,
    passed: bool,
    json: bool,
    failed: &str,
) -> ExitCode {
    if json {
        match serde_json::to_string_pretty(report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("{failed}: the report as JSON: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", summary());
    }
    if passed {
        ExitCode::SUCCESS
    } else {
        eprintln!("{failed}");
        ExitCode::FAILURE
    }
}
