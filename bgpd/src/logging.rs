//! Logs through `tracing`: one line per event on stderr, level from the configuration.

use tracing::level_filters::LevelFilter;

use crate::config::LogLevel;

impl From<LogLevel> for LevelFilter {
    fn from(level: LogLevel) -> Self {
        match level {
            LogLevel::Error => LevelFilter::ERROR,
            LogLevel::Warn => LevelFilter::WARN,
            LogLevel::Info => LevelFilter::INFO,
            LogLevel::Debug => LevelFilter::DEBUG,
            LogLevel::Trace => LevelFilter::TRACE,
        }
    }
}

/// Installs the global subscriber. Colours only on a terminal.
pub fn init(level: LogLevel) {
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_max_level(LevelFilter::from(level))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}
