//! Log lines, in one place: every command installs one `tracing` subscriber
//! writing to stderr, so what the libraries log (the runtime's compile
//! cache, the policy's threads, the server) reaches the person running the
//! command instead of going nowhere.
//!
//! [`LOG_VAR`] (`RAGEN_LOG`) picks what is shown, in `tracing`'s filter
//! syntax: `RAGEN_LOG=info`, `RAGEN_LOG=debug`, `RAGEN_LOG=ragen_runtime=debug`.
//! Without it, commands show warnings and errors as `warning: …` lines, like
//! their own; `serve` shows `info` and up in `tracing`'s usual format (or
//! JSON lines with `--log-json`), as a server's log.
//!
//! A log reader that went away (`| head`, a dead collector) must not stop
//! the command: a failed write is dropped, not reported with `eprintln!`
//! (which would panic on the same closed pipe, in whatever thread or task
//! was logging, a server's shutdown included).

use std::fmt;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The environment variable that filters log lines (as wasmtime's
/// `WASMTIME_LOG` does for it; `RUST_LOG` is left to other programs).
pub const LOG_VAR: &str = "RAGEN_LOG";

/// How a command logs.
#[derive(Clone, Copy)]
pub enum Logs {
    /// Warnings and errors as `warning: …` lines.
    Cli,
    /// A server's log: `info` and up, with times and targets, as text or
    /// JSON lines.
    Server { json: bool },
}

/// Install the process's subscriber. Call once, before the command runs.
pub fn init(logs: Logs) {
    let default = match logs {
        Logs::Cli => "warn",
        Logs::Server { .. } => "info",
    };
    let filter = EnvFilter::try_from_env(LOG_VAR).unwrap_or_else(|_| EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).log_internal_errors(false);
    // Only fails when a subscriber is already installed: then that one logs.
    let _ = match logs {
        Logs::Cli => builder.with_ansi(false).event_format(CliFormat).try_init(),
        Logs::Server { json: true } => builder.with_ansi(ansi).json().try_init(),
        Logs::Server { json: false } => builder.with_ansi(ansi).try_init(),
    };
}

/// `warning: message key=value`: a log line that reads like the command's
/// own messages.
struct CliFormat;

impl<S, N> FormatEvent<S, N> for CliFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let level = match *event.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            Level::INFO => "info",
            Level::DEBUG => "debug",
            Level::TRACE => "trace",
        };
        write!(writer, "{level}: ")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}
