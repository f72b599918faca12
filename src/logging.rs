//! Log output (`POLYRAIL_LOG`), on standard error, through `tracing`.

use polyrail_core::config::LogLevel;

/// Installs a stderr subscriber at `level` unless the program installed its own.
pub(crate) fn init(level: LogLevel) {
    let filter = match level {
        LogLevel::Error => tracing::Level::ERROR,
        LogLevel::Warn => tracing::Level::WARN,
        LogLevel::Info => tracing::Level::INFO,
        LogLevel::Debug => tracing::Level::DEBUG,
        LogLevel::Trace => tracing::Level::TRACE,
    };
    let _ = tracing_subscriber::fmt()
        .with_max_level(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .without_time()
        .try_init();
}
