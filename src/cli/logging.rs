//! The log of the controller and of the node agent: one line per event, as
//! text for people (colour only when the stream is a terminal) or as JSON
//! objects for log pipelines (`--log-format json`, `VRAMFIT_LOG_FORMAT`).

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `TIME LEVEL target: message key=value ...`.
    #[default]
    Text,
    /// One JSON object a line: `timestamp`, `level`, `target`, `message` and
    /// the event's fields at the top level.
    Json,
}

/// The filter when `RUST_LOG` is not set.
pub const DEFAULT_FILTER: &str = "info,kube=warn";

/// A subscriber writing to `writer`. `colour` applies to text only.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    colour: bool,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(colour).finish()),
        LogFormat::Json => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish(),
        ),
    }
}

/// The stream log lines go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogStream {
    /// Standard output (the controller).
    Stdout,
    /// Standard error (the node agent, whose standard output carries `--once`'s JSON).
    Stderr,
}

impl LogStream {
    fn is_terminal(self) -> bool {
        use std::io::IsTerminal as _;
        match self {
            Self::Stdout => std::io::stdout().is_terminal(),
            Self::Stderr => std::io::stderr().is_terminal(),
        }
    }
}

/// Installs the process's subscriber: standard output, `RUST_LOG` or
/// [`DEFAULT_FILTER`], colour only when standard output is a terminal.
pub fn init(format: LogFormat) -> anyhow::Result<()> {
    init_on(format, DEFAULT_FILTER, LogStream::Stdout)
}

/// Installs the process's subscriber on `stream`: `RUST_LOG`, else
/// `default_filter`; text has colour only when `stream` is a terminal.
pub fn init_on(format: LogFormat, default_filter: &str, stream: LogStream) -> anyhow::Result<()> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into());
    let colour = stream.is_terminal();
    let subscriber = match stream {
        LogStream::Stdout => subscriber(format, filter, std::io::stdout, colour),
        LogStream::Stderr => subscriber(format, filter, std::io::stderr, colour),
    };
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
}

#[cfg(test)]
#[path = "logging_tests.rs"]
mod tests;
