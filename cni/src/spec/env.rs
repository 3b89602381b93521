//! The CNI_* environment: which command, for which container, in which namespace, with which
//! interface name and extra arguments. Parsed from a lookup function so it is tested without
//! touching the process environment. Which variables each command requires follows the spec's
//! section 2; every refusal names the variable (error code 4).

use std::path::PathBuf;

use super::error::{CniError, code};

/// The operation asked for in CNI_COMMAND.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl Command {
    pub fn parse(text: &str) -> Option<Command> {
        Some(match text {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Gc => "GC",
            Command::Status => "STATUS",
            Command::Version => "VERSION",
        }
    }

    /// Whether the command concerns one attachment (container id and interface name).
    fn per_attachment(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }

    /// Whether CNI_NETNS must be set (DEL may come after the namespace is gone).
    fn needs_netns(self) -> bool {
        matches!(self, Command::Add | Command::Check)
    }
}

/// CNI_ARGS: `KEY=VALUE;KEY=VALUE`. Only the keys margay reads are kept; others (e.g.
/// `IgnoreUnknown`) are ignored, as the conventions ask of plugins.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub k8s_namespace: Option<String>,
    pub k8s_pod: Option<String>,
    /// `K8S_POD_INFRA_CONTAINER_ID`: the sandbox's container, as a kubelet's runtime passes it.
    pub k8s_infra_container_id: Option<String>,
    /// `K8S_POD_UID`.
    pub k8s_pod_uid: Option<String>,
    /// `IP=` (comma-separated addresses, each with an optional prefix length).
    pub ips: Vec<String>,
}

impl CniArgs {
    pub fn parse(text: &str) -> Result<CniArgs, CniError> {
        let mut args = CniArgs::default();
        for pair in text.split(';').filter(|p| !p.is_empty()) {
            let Some((key, value)) = pair.split_once('=') else {
                return Err(CniError::new(
                    code::INVALID_ENVIRONMENT,
                    format!("CNI_ARGS: {pair:?} is not KEY=VALUE"),
                ));
            };
            let value = value.trim();
            match key.trim() {
                "K8S_POD_NAMESPACE" if !value.is_empty() => {
                    args.k8s_namespace = Some(value.to_owned())
                }
                "K8S_POD_NAME" if !value.is_empty() => args.k8s_pod = Some(value.to_owned()),
                "K8S_POD_INFRA_CONTAINER_ID" if !value.is_empty() => {
                    args.k8s_infra_container_id = Some(value.to_owned())
                }
                "K8S_POD_UID" if !value.is_empty() => args.k8s_pod_uid = Some(value.to_owned()),
                "IP" => args.ips.extend(
                    value
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned),
                ),
                _ => {}
            }
        }
        Ok(args)
    }

    /// `<namespace>.<pod>` when both are known (Kubernetes).
    pub fn workload_key(&self) -> Option<String> {
        match (&self.k8s_namespace, &self.k8s_pod) {
            (Some(ns), Some(pod)) => Some(format!("{ns}.{pod}")),
            _ => None,
        }
    }
}

/// The parsed environment of one invocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Env {
    pub command: Command,
    /// Set for ADD, DEL and CHECK (required there).
    pub container_id: String,
    pub netns: Option<PathBuf>,
    pub ifname: String,
    pub args: CniArgs,
    /// CNI_ARGS as given, passed on to delegated plugins unchanged.
    pub raw_args: String,
    pub path: Vec<PathBuf>,
}

impl Env {
    /// Reads and validates the variables `command` needs. `get` returns a variable's value
    /// (None when unset; an empty value counts as unset, as in libcni).
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Env, CniError> {
        let var = |name: &str| get(name).filter(|v| !v.is_empty());
        let Some(cmd_text) = var("CNI_COMMAND") else {
            return Err(missing(&["CNI_COMMAND"]));
        };
        let Some(command) = Command::parse(&cmd_text) else {
            return Err(CniError::new(
                code::INVALID_ENVIRONMENT,
                format!(
                    "CNI_COMMAND {cmd_text:?} is not one of ADD, DEL, CHECK, GC, STATUS, VERSION"
                ),
            ));
        };
        let container_id = var("CNI_CONTAINERID");
        let netns = var("CNI_NETNS");
        let ifname = var("CNI_IFNAME");
        let path = var("CNI_PATH");

        let mut absent = Vec::new();
        if command.per_attachment() {
            if container_id.is_none() {
                absent.push("CNI_CONTAINERID");
            }
            if ifname.is_none() {
                absent.push("CNI_IFNAME");
            }
        }
        if command.needs_netns() && netns.is_none() {
            absent.push("CNI_NETNS");
        }
        // The spec makes CNI_PATH optional for attachments and required for GC, where the
        // plugin must forward the call to its delegates.
        if command == Command::Gc && path.is_none() {
            absent.push("CNI_PATH");
        }
        if !absent.is_empty() {
            return Err(missing(&absent));
        }

        let container_id = container_id.unwrap_or_default();
        let ifname = ifname.unwrap_or_default();
        if command.per_attachment() {
            validate_container_id(&container_id)?;
            validate_ifname(&ifname)?;
        }
        let raw_args = var("CNI_ARGS").unwrap_or_default();
        let args = CniArgs::parse(&raw_args)?;
        Ok(Env {
            command,
            container_id,
            netns: netns.map(PathBuf::from),
            ifname,
            args,
            raw_args,
            path: path
                .map(|p| {
                    std::env::split_paths(&p)
                        .filter(|d| !d.as_os_str().is_empty())
                        .collect()
                })
                .unwrap_or_default(),
        })
    }
}

fn missing(names: &[&str]) -> CniError {
    CniError::new(
        code::INVALID_ENVIRONMENT,
        format!(
            "required environment variables missing: {}",
            names.join(", ")
        ),
    )
}

/// A name as the spec allows for container ids and network names: an alphanumeric first
/// character, then alphanumerics, `_`, `.` or `-`.
pub fn is_valid_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn validate_container_id(id: &str) -> Result<(), CniError> {
    if is_valid_name(id) {
        Ok(())
    } else {
        Err(CniError::new(
            code::INVALID_ENVIRONMENT,
            format!(
                "CNI_CONTAINERID {id:?} is invalid: it must start with a letter or digit, then letters, digits, '_', '.' or '-'"
            ),
        ))
    }
}

/// Linux interface names: 1 to 15 bytes, not "." or "..", no '/', ':' or whitespace.
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    let reason = if name.is_empty() {
        Some("it is empty")
    } else if name.len() > 15 {
        Some("it is longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("\".\" and \"..\" are not interface names")
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some("it contains '/', ':' or whitespace")
    } else {
        None
    };
    match reason {
        None => Ok(()),
        Some(r) => Err(CniError::new(
            code::INVALID_ENVIRONMENT,
            format!("CNI_IFNAME {name:?} is invalid: {r}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<Env, CniError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::parse(|k| map.get(k).cloned())
    }

    const FULL: &[(&str, &str)] = &[
        ("CNI_CONTAINERID", "abc123"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=x",
        ),
    ];

    fn with(cmd: &str, drop: &[&str]) -> Result<Env, CniError> {
        let mut vars: Vec<(&str, &str)> = FULL
            .iter()
            .copied()
            .filter(|(k, _)| !drop.contains(k))
            .collect();
        vars.push(("CNI_COMMAND", cmd));
        env(&vars)
    }

    #[test]
    fn a_full_add() {
        let e = with("ADD", &[]).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.container_id, "abc123");
        assert_eq!(
            e.netns.as_deref(),
            Some(std::path::Path::new("/run/netns/x"))
        );
        assert_eq!(e.ifname, "eth0");
        assert_eq!(e.path.len(), 2);
        assert_eq!(e.args.workload_key().as_deref(), Some("default.web-0"));
    }

    #[test]
    fn required_variables_per_command() {
        // (command, variable dropped, refused?)
        let cases = [
            ("ADD", "CNI_CONTAINERID", true),
            ("ADD", "CNI_NETNS", true),
            ("ADD", "CNI_IFNAME", true),
            ("ADD", "CNI_PATH", false),
            ("ADD", "CNI_ARGS", false),
            ("DEL", "CNI_NETNS", false),
            ("DEL", "CNI_CONTAINERID", true),
            ("DEL", "CNI_IFNAME", true),
            ("CHECK", "CNI_NETNS", true),
            ("CHECK", "CNI_CONTAINERID", true),
            ("GC", "CNI_CONTAINERID", false),
            ("GC", "CNI_NETNS", false),
            ("GC", "CNI_PATH", true),
            ("STATUS", "CNI_CONTAINERID", false),
            ("STATUS", "CNI_PATH", false),
            ("VERSION", "CNI_CONTAINERID", false),
            ("VERSION", "CNI_IFNAME", false),
        ];
        for (cmd, var, refused) in cases {
            let r = with(cmd, &[var]);
            match (refused, r) {
                (true, Err(e)) => {
                    assert_eq!(e.code, code::INVALID_ENVIRONMENT, "{cmd} without {var}");
                    assert!(e.msg.contains(var), "{cmd} without {var}: {}", e.msg);
                }
                (false, Ok(_)) => {}
                (want, got) => panic!("{cmd} without {var}: want refused={want}, got {got:?}"),
            }
        }
    }

    #[test]
    fn all_missing_variables_are_named_at_once() {
        let e = env(&[("CNI_COMMAND", "ADD")]).unwrap_err();
        for v in ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS"] {
            assert!(e.msg.contains(v), "{}", e.msg);
        }
    }

    #[test]
    fn empty_counts_as_unset() {
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", ""),
            ("CNI_NETNS", "/x"),
            ("CNI_IFNAME", "eth0"),
        ])
        .unwrap_err();
        assert!(e.msg.contains("CNI_CONTAINERID"));
    }

    #[test]
    fn command_missing_or_unknown() {
        assert_eq!(env(&[]).unwrap_err().code, code::INVALID_ENVIRONMENT);
        assert!(env(&[]).unwrap_err().msg.contains("CNI_COMMAND"));
        let e = env(&[("CNI_COMMAND", "add")]).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        assert!(e.msg.contains("\"add\""), "{}", e.msg);
        for c in ["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"] {
            assert_eq!(Command::parse(c).unwrap().as_str(), c);
        }
    }

    #[test]
    fn container_ids() {
        for ok in ["a", "0", "abc-1.2_3", "3f6940ab5ab43bc522569d15b23f8c1b"] {
            assert!(is_valid_name(ok), "{ok}");
        }
        for bad in ["", "-a", ".a", "_a", "a b", "a/b", "a;b", "ä"] {
            assert!(!is_valid_name(bad), "{bad}");
        }
        let mut vars = FULL.to_vec();
        vars.retain(|(k, _)| *k != "CNI_CONTAINERID");
        vars.push(("CNI_CONTAINERID", "-bad"));
        vars.push(("CNI_COMMAND", "DEL"));
        let e = env(&vars).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        assert!(e.msg.contains("CNI_CONTAINERID"));
    }

    #[test]
    fn interface_names() {
        for ok in ["eth0", "a", "net1", "x23456789012345"] {
            assert!(validate_ifname(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "x234567890123456",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
        ] {
            let e = validate_ifname(bad).unwrap_err();
            assert_eq!(e.code, code::INVALID_ENVIRONMENT);
            assert!(e.msg.contains("CNI_IFNAME"), "{bad}: {}", e.msg);
        }
    }

    #[test]
    fn cni_args() {
        let a = CniArgs::parse("IgnoreUnknown=1;IP=10.0.0.5/24, fd00::5 ;K8S_POD_NAME=p").unwrap();
        assert_eq!(a.ips, ["10.0.0.5/24", "fd00::5"]);
        assert_eq!(a.k8s_pod.as_deref(), Some("p"));
        assert_eq!(a.workload_key(), None, "namespace missing");
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
        assert_eq!(CniArgs::parse(";;").unwrap(), CniArgs::default());
        assert_eq!(
            CniArgs::parse("K8S_POD_NAMESPACE=;K8S_POD_NAME=").unwrap(),
            CniArgs::default()
        );
        let e = CniArgs::parse("FOO").unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        assert!(e.msg.contains("CNI_ARGS"));
        // A value may itself contain '='.
        assert!(CniArgs::parse("X=a=b").is_ok());
    }
}
