//! `bgpctl status`: the node, its datastore, uptime and version.

use proto::v1::{DaemonStatus, DatastoreState};
use serde::Serialize;

/// The JSON shape of `bgpctl status --json`.
#[derive(Debug, Serialize)]
pub struct StatusJson<'a> {
    pub node: &'a str,
    pub datastore: &'a str,
    pub datastore_state: &'static str,
    pub uptime_s: u64,
    pub version: &'a str,
}

pub fn datastore_state(status: &DaemonStatus) -> &'static str {
    match status.datastore_state() {
        DatastoreState::Connected => "connected",
        DatastoreState::Unavailable => "unavailable",
        DatastoreState::NotOpened => "not opened",
        DatastoreState::Unspecified => "unknown",
    }
}

pub fn to_json(status: &DaemonStatus) -> String {
    let json = StatusJson {
        node: &status.node,
        datastore: &status.datastore,
        datastore_state: datastore_state(status),
        uptime_s: status.uptime_s,
        version: &status.version,
    };
    serde_json::to_string(&json).expect("a struct of strings and numbers always serialises")
}

pub fn to_table(status: &DaemonStatus) -> String {
    let mut datastore = format!("{} ({})", status.datastore, datastore_state(status));
    if !status.datastore_error.is_empty() {
        datastore.push_str(&format!(": {}", status.datastore_error));
    }
    let rows = [
        ("node", status.node.clone()),
        ("datastore", datastore),
        ("uptime", human_duration(status.uptime_s)),
        ("version", status.version.clone()),
    ];
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{k:<10} {v}\n"));
    }
    out
}

/// "3d 4h 5m 6s", leaving out leading zero units.
pub fn human_duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m {s}s"),
        _ => format!("{d}d {h}h {m}m {s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DaemonStatus {
        DaemonStatus {
            node: "node-a".into(),
            datastore: "sqlite:/tmp/s.db".into(),
            datastore_state: DatastoreState::Connected.into(),
            uptime_s: 3725,
            version: "0.1.0".into(),
            datastore_error: String::new(),
        }
    }

    #[test]
    fn json_has_the_documented_keys() {
        let v: serde_json::Value = serde_json::from_str(&to_json(&sample())).unwrap();
        assert_eq!(v["node"], "node-a");
        assert_eq!(v["datastore"], "sqlite:/tmp/s.db");
        assert_eq!(v["uptime_s"], 3725);
        assert_eq!(v["version"], "0.1.0");
        assert_eq!(v["datastore_state"], "connected");
    }

    #[test]
    fn table_lines() {
        let t = to_table(&sample());
        assert_eq!(
            t,
            "node       node-a\ndatastore  sqlite:/tmp/s.db (connected)\nuptime     1h 2m 5s\nversion    0.1.0\n"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(human_duration(0), "0s");
        assert_eq!(human_duration(61), "1m 1s");
        assert_eq!(human_duration(86400 + 1), "1d 0h 0m 1s");
    }
}
