//! The CNI error object (`cniVersion`, `code`, `msg`, `details`) and the error codes: the
//! spec's well-known ones and margay's own (100 and up, as the spec allows).

use serde_json::{Value, json};

/// Error codes. 1-99 are the specification's; 100+ are margay's.
pub mod code {
    /// The configuration's `cniVersion` is not one margay speaks, or the command does not
    /// exist in it.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// A configuration field margay knows but does not support (the message names key and value).
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// The container (its network namespace) does not exist: nothing to clean up.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// A CNI_* environment variable is missing or invalid (the message names it).
    pub const INVALID_ENVIRONMENT: u32 = 4;
    /// Reading stdin or writing stdout failed.
    pub const IO: u32 = 5;
    /// stdin (or a prevResult, or a delegate's answer) is not the JSON expected.
    pub const DECODE: u32 = 6;
    /// The configuration is well-formed but invalid.
    pub const INVALID_CONFIG: u32 = 7;
    /// A transient condition (bgpd unreachable, its datastore down): the runtime should retry.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin cannot serve ADD now.
    pub const NOT_AVAILABLE: u32 = 50;
    /// The kernel refused a change (netlink or sysctl).
    pub const KERNEL: u32 = 100;
    /// No address left in the pools this node may use.
    pub const NO_ADDRESS: u32 = 101;
    /// bgpd refused the request (e.g. a requested address in use, an unknown pool).
    pub const IPAM_REFUSED: u32 = 102;
    /// CHECK found the container's networking not as ADD left it.
    pub const CHECK_FAILED: u32 = 103;
    /// A delegated plugin failed without a CNI error of its own, or could not be run.
    pub const DELEGATE: u32 = 104;
    /// A bug in margay (a caught panic).
    pub const INTERNAL: u32 = 999;
}

/// One error as the runtime sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> CniError {
        self.details = details.into();
        self
    }

    /// The JSON object printed on stdout. `details` is left out when empty.
    pub fn to_json(&self, cni_version: &str) -> Value {
        let mut v = json!({
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
        });
        if !self.details.is_empty() {
            v["details"] = Value::String(self.details.clone());
        }
        v
    }

    /// Reads an error object (what a delegated plugin printed). None if it is not one.
    pub fn from_json(v: &Value) -> Option<CniError> {
        let code = u32::try_from(v.get("code")?.as_u64()?).ok()?;
        Some(CniError {
            code,
            msg: v
                .get("msg")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            details: v
                .get("details")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        })
    }
}

impl std::fmt::Display for CniError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.msg, self.code)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_with_and_without_details() {
        let e = CniError::new(code::INVALID_ENVIRONMENT, "CNI_NETNS is missing");
        assert_eq!(
            e.to_json("1.0.0"),
            json!({"cniVersion": "1.0.0", "code": 4, "msg": "CNI_NETNS is missing"})
        );
        let e = e.with_details("ADD needs it");
        assert_eq!(e.to_json("0.4.0")["details"], "ADD needs it");
        assert_eq!(e.to_json("0.4.0")["cniVersion"], "0.4.0");
    }

    #[test]
    fn reads_a_delegates_error_and_refuses_non_errors() {
        let v = json!({"cniVersion": "1.0.0", "code": 7, "msg": "bad", "details": "why"});
        let e = CniError::from_json(&v).unwrap();
        assert_eq!(
            (e.code, e.msg.as_str(), e.details.as_str()),
            (7, "bad", "why")
        );
        assert_eq!(CniError::from_json(&json!({"code": 11})).unwrap().msg, "");
        assert!(CniError::from_json(&json!({"ips": []})).is_none());
        assert!(CniError::from_json(&json!({"code": "7"})).is_none());
        assert!(CniError::from_json(&json!({"code": -1})).is_none());
        assert!(CniError::from_json(&json!([1])).is_none());
    }

    #[test]
    fn display_names_code_and_details() {
        let e = CniError::new(11, "bgpd unreachable").with_details("after 3 s");
        assert_eq!(e.to_string(), "bgpd unreachable (code 11): after 3 s");
    }
}
