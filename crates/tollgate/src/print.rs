//! Printing: results on stdout, the one-line failure reason on stderr.

use std::io::Write;
use std::process::ExitCode;

/// Writes one line to stdout.
pub fn line(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}");
}

/// Writes a JSON value to stdout on one line.
pub fn json(value: &serde_json::Value) {
    line(&value.to_string());
}

/// Reports a failure on stderr and returns the failing exit code.
pub fn fail(reason: &str) -> ExitCode {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "tollgate: {reason}");
    ExitCode::FAILURE
}
