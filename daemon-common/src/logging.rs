//! Logs through `tracing` and `tracing-subscriber`: one line per event on stderr, as text
//! (colours only on a terminal) or, with `log.format = "json"`, as one JSON object per line.
//! The level comes from `log.level`; `RUST_LOG`, when set, overrides it with per-target
//! directives (`info,h2=warn`).

use std::io::IsTerminal;

use tracing::level_filters::LevelFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogConfig, LogFormat, LogLevel};

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

/// The filter: `rust_log` (the variable's value) when given and valid, else `level` for
/// every target. An invalid `RUST_LOG` is reported, and the configured level used.
pub fn filter(level: LogLevel, rust_log: Option<&str>) -> (Targets, Option<String>) {
    let configured = Targets::new().with_default(LevelFilter::from(level));
    match rust_log.map(str::trim).filter(|v| !v.is_empty()) {
        None => (configured, None),
        Some(v) => match v.parse::<Targets>() {
            Ok(t) => (t, None),
            Err(e) => (
                configured,
                Some(format!(
                    "RUST_LOG={v:?} is not a valid filter ({e}); logging at log.level"
                )),
            ),
        },
    }
}

/// Installs the global subscriber (once; later calls change nothing).
pub fn init(config: &LogConfig) {
    let (targets, problem) = filter(config.level, std::env::var("RUST_LOG").ok().as_deref());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false);
    let installed = match config.format {
        LogFormat::Text => tracing_subscriber::registry()
            .with(
                fmt.with_ansi(std::io::stderr().is_terminal())
                    .with_filter(targets),
            )
            .try_init(),
        LogFormat::Json => tracing_subscriber::registry()
            .with(fmt.json().with_ansi(false).with_filter(targets))
            .try_init(),
    };
    if let (Ok(()), Some(problem)) = (installed, problem) {
        tracing::warn!("{problem}");
    }
}

#[cfg(test)]
mod tests {
    use tracing::Level;

    use super::*;

    #[test]
    fn configured_level_without_rust_log() {
        let (t, problem) = filter(LogLevel::Warn, None);
        assert!(problem.is_none());
        assert!(t.would_enable("bgpd", &Level::WARN));
        assert!(!t.would_enable("bgpd", &Level::INFO));
    }

    #[test]
    fn rust_log_overrides_per_target() {
        let (t, problem) = filter(LogLevel::Info, Some("debug,h2=warn"));
        assert!(problem.is_none());
        assert!(t.would_enable("bgpd::speaker", &Level::DEBUG));
        assert!(!t.would_enable("h2::codec", &Level::INFO));
    }

    #[test]
    fn invalid_rust_log_falls_back_and_says_so() {
        let (t, problem) = filter(LogLevel::Error, Some("bgpd=loud"));
        assert!(problem.unwrap().contains("RUST_LOG"));
        assert!(t.would_enable("x", &Level::ERROR));
        assert!(!t.would_enable("x", &Level::WARN));
    }

    #[test]
    fn empty_rust_log_is_unset() {
        let (t, problem) = filter(LogLevel::Debug, Some("  "));
        assert!(problem.is_none());
        assert!(t.would_enable("x", &Level::DEBUG));
    }
}
