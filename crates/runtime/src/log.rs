//! `POLYRAIL_LOG`: polyrail's `tracing` events on standard error, as `polyrail: LEVEL message`.
//!
//! A small subscriber of its own, so that a program embedding polyrail does not compile a
//! subscriber crate; a program that installs its own subscriber first keeps it.

use polyrail_core::config::LogLevel;
use std::fmt::Write as _;
use std::io::Write as _;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Installs the stderr subscriber at `level` unless the program installed one already.
pub fn init(level: LogLevel) {
    let max = match level {
        LogLevel::Error => Level::ERROR,
        LogLevel::Warn => Level::WARN,
        LogLevel::Info => Level::INFO,
        LogLevel::Debug => Level::DEBUG,
        LogLevel::Trace => Level::TRACE,
    };
    // Fails only when a global subscriber is set already: then that one stays.
    let _ = tracing::subscriber::set_global_default(Stderr { max });
}

/// Writes every event at `max` or more severe as one line on standard error.
struct Stderr {
    max: Level,
}

/// Collects an event's message and its other fields (`key=value`).
#[derive(Default)]
struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, "{}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }
}

impl Subscriber for Stderr {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        // Level orders verbosity: TRACE > DEBUG > ... > ERROR.
        *metadata.level() <= self.max
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(self.max.into())
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        // polyrail opens no spans; every span gets the same id and nothing is recorded.
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut line = Line::default();
        event.record(&mut line);
        // One write per line, so that lines of threads writing at once do not mix.
        let text = format!("polyrail: {:>5} {}\n", event.metadata().level(), line.0);
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}
