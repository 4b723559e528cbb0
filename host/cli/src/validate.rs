//! `ragen-host validate`: the conformance suite (`ragen-conformance`) with
//! a spinner, and its report as lines a person reads. `push` runs the same
//! before it publishes.

use ragen_conformance::{Report, Status};
use std::fmt::Write;
use std::path::Path;
use std::time::{Duration, Instant};

pub use ragen_conformance::Options;

/// The report as `validate` prints it: one line per check, then the verdict.
pub fn to_text(report: &Report) -> String {
    let mut s = format!("validate {}\n", report.file);
    for c in &report.checks {
        let mark = match c.status {
            Status::Pass => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        let _ = writeln!(s, "  {mark:<4}  {:<13} {}", c.name, c.message);
    }
    let count = |status: Status| report.checks.iter().filter(|c| c.status == status).count();
    let (failed, warned, all) = (count(Status::Fail), count(Status::Warn), report.checks.len());
    let _ = match (failed, warned) {
        (0, 0) => writeln!(s, "PASS: all {all} checks passed"),
        (0, _) => writeln!(s, "PASS: all {all} checks passed ({warned} with a warning)"),
        _ => writeln!(s, "FAIL: {failed} of {all} checks failed"),
    };
    s
}

/// [`ragen_conformance::validate`] with a spinner naming the check under way.
pub fn run_with_spinner(file: &Path, opts: &Options) -> Report {
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.enable_steady_tick(Duration::from_millis(120));
    let started = Instant::now();
    let budget = opts.budget.as_secs_f64();
    let report = ragen_conformance::validate(file, opts, &mut |check| {
        spinner.set_message(format!("validate: {check} ({:.0} s of {budget:.0} s)", started.elapsed().as_secs_f64()))
    });
    spinner.finish_and_clear();
    report
}
