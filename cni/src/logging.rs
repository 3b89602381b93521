//! Log lines through `tracing`: to the file `log_file_path` (appended, its directory created)
//! or, without one, to stderr, which runtimes keep; at `log_level`. stdout is the protocol's
//! and never carries a log line. A log file that cannot be opened falls back to stderr rather
//! than failing the pod.

use std::fs::OpenOptions;
use std::path::Path;
use std::sync::Mutex;

use tracing::level_filters::LevelFilter;

use crate::spec::config::LogLevel;

fn filter(level: LogLevel) -> LevelFilter {
    match level {
        LogLevel::Error => LevelFilter::ERROR,
        LogLevel::Warn => LevelFilter::WARN,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Trace => LevelFilter::TRACE,
    }
}

/// Installs the subscriber for this invocation.
pub fn init(level: LogLevel, file: Option<&Path>) {
    let builder = tracing_subscriber::fmt()
        .with_max_level(filter(level))
        .with_ansi(false)
        .with_target(false);
    if let Some(path) = file {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        match OpenOptions::new().create(true).append(true).open(path) {
            Ok(f) => {
                let _ = builder.with_writer(Mutex::new(f)).try_init();
                return;
            }
            Err(e) => eprintln!(
                "margay: cannot open the log file {}: {e}; logging to stderr",
                path.display()
            ),
        }
    }
    let _ = builder.with_writer(std::io::stderr).try_init();
}
