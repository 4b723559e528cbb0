//! What the command line itself writes, on streams that may close.
//! `println!` and `eprintln!` panic when their stream is gone (`ragen-host
//! … | head`, a log reader that died), so every line goes through here: a
//! report on a closed stdout is dropped and the command's exit code still
//! says how it went, a command that writes as it goes (`play`) stops
//! quietly, and a line for a closed stderr is dropped.
//!
//! Log lines (`tracing`) go through [`crate::logging`], which drops failed
//! writes the same way; indicatif's progress bars ignore write errors and
//! hide themselves on anything but a terminal.

use anyhow::{Context, Result};
use std::fmt;
use std::io::{self, Write};

/// What a write to a closed stdout fails with: the reader went away, so
/// `main` ends the command quietly, with success (see [`is_stdout_closed`]).
#[derive(Debug)]
pub struct StdoutClosed;

impl fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stdout was closed (its reader went away)")
    }
}

impl std::error::Error for StdoutClosed {}

/// stdout as a writer whose closed pipe fails with [`StdoutClosed`] inside
/// the `io::Error`, so the error can be told from any other broken pipe
/// (a registry connection, a socket).
pub struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        io::stdout().lock().write(buf).map_err(closed)
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stdout().lock().flush().map_err(closed)
    }
}

fn closed(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::BrokenPipe { io::Error::new(io::ErrorKind::BrokenPipe, StdoutClosed) } else { e }
}

/// Whether `e` is, or was caused by, a write to a closed stdout.
pub fn is_stdout_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause.is::<StdoutClosed>()
            || cause.downcast_ref::<io::Error>().and_then(|e| e.get_ref()).is_some_and(|inner| inner.is::<StdoutClosed>())
    })
}

/// Write a command's report to stdout. On a closed stdout it is dropped:
/// the command did its work, and its exit code still says how that went.
/// Any other failure (a full disk under a redirect) is an error.
pub fn print(text: &str) -> Result<()> {
    let mut out = Stdout;
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("cannot write to stdout"),
    }
}

/// Print `report` as one pretty JSON object (`--json`) or as its text.
pub fn print_report<T: serde::Serialize>(report: &T, json: bool, text: impl FnOnce(&T) -> String) -> Result<()> {
    if json {
        print(&format!("{}\n", serde_json::to_string_pretty(report).context("cannot write JSON")?))
    } else {
        print(&crate::term::escape(&text(report)))
    }
}

/// Write `text` to stderr as it is; nothing when stderr is closed.
pub fn eprint(text: &str) {
    let _ = io::stderr().lock().write_all(text.as_bytes());
}

/// Write one line to stderr; nothing when stderr is closed (what `errln!`
/// expands to).
pub fn eprint_line(line: fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "{line}");
}

/// `eprintln!` that drops the line when stderr is closed instead of
/// panicking: a message nobody can read must not stop the command.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::output::eprint_line(format_args!($($arg)*))
    };
}
pub(crate) use errln;
