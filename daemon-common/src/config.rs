//! The configuration loading both daemons share: a TOML file read with the `config` crate,
//! every key overridable by an environment variable `MARGAY_<SECTION>__<KEY>`, and the `[log]`
//! section. Each daemon defines its own sections and validates them.

use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: Box<config::ConfigError>,
    },
    #[error("invalid configuration: {0}")]
    Invalid(Box<config::ConfigError>),
    #[error("invalid configuration: {field}: {reason}")]
    Field { field: &'static str, reason: String },
}

/// A `Field` error: the key and what is wrong with it.
pub fn field(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field,
        reason: reason.into(),
    }
}

/// How much is logged.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One line of text per event.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The `[log]` section. `RUST_LOG`, when set, overrides `level` (with its full syntax:
/// `debug,h2=info`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub level: LogLevel,
    pub format: LogFormat,
}

/// The file at `path` (when given) under the process's (or the given) `MARGAY_` environment:
/// the loading every margay daemon shares. `list_keys` are read from the environment as
/// comma-separated lists.
pub fn load_layers<T: serde::de::DeserializeOwned>(
    path: Option<&Path>,
    env: Option<config::Map<String, String>>,
    list_keys: &[&str],
) -> Result<T, ConfigError> {
    let mut builder = config::Config::builder();
    if let Some(path) = path {
        // Read the file ourselves so a missing file is an error that names it.
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.to_owned(),
            source: Box::new(config::ConfigError::Foreign(Box::new(e))),
        })?;
        builder = builder.add_source(config::File::from_str(&text, config::FileFormat::Toml));
    }
    let mut environment = config::Environment::with_prefix("MARGAY")
        .prefix_separator("_")
        .separator("__")
        .try_parsing(true)
        .source(env);
    // A list separator without list keys would split every value.
    if !list_keys.is_empty() {
        environment = environment.list_separator(",");
        for key in list_keys {
            environment = environment.with_list_parse_key(key);
        }
    }
    let raw = builder
        .add_source(environment)
        .build()
        .map_err(|e| ConfigError::Invalid(Box::new(e)))?;
    raw.try_deserialize().map_err(|e| match path {
        Some(path) => ConfigError::Read {
            path: path.to_owned(),
            source: Box::new(e),
        },
        None => ConfigError::Invalid(Box::new(e)),
    })
}

/// The host name, lower case (as Kubernetes node names), or "" when the kernel has none.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_lowercase())
        .unwrap_or_default()
}
