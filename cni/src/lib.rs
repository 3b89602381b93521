//! margay's CNI plugins: `margay` wires a pod to the host the way Calico does, `margay-ipam`
//! hands out its addresses from bgpd over the unix socket. One program serves both names (it
//! looks at argv[0]).
//!
//! - `spec`: the CNI protocol, sans IO (environment, configuration, results, errors, versions).
//! - `plugin` (this file): one invocation: stdin and environment in, one JSON document out.
//! - `main_plugin`: ADD/DEL/GC/STATUS of `margay`; `check`: its CHECK.
//! - `ipam_plugin`: `margay-ipam`, also run in-process by `margay`; `ipam_status`: STATUS.
//! - `attachment`: what both plugins know of one attachment: its host interface's name and its
//!   namespace.
//! - `dataplane`: the veth pair, addresses, routes and sysctls, with rollback.
//! - `netlink`, `netns`: the kernel and namespace plumbing.
//! - `bgpd_client`, `retry`: the bounded gRPC calls to bgpd.
//! - `delegate`: running another IPAM plugin per the spec.
//! - `endpoint`: the pod's WorkloadEndpoint (namespace, pod, labels, interface, addresses),
//!   recorded with bgpd for network policy.
//! - `names`: Calico's interface names, MAC and gateways; `subnet`: the gateway and the
//!   withheld addresses of a block whose prefix a pod of another main plugin has.
//! - `install`: the install command; `logging`: log lines to a file or stderr.

pub mod attachment;
pub mod bgpd_client;
pub mod check;
pub mod dataplane;
pub mod delegate;
pub mod endpoint;
pub mod install;
pub mod ipam_plugin;
pub mod ipam_status;
pub mod logging;
pub mod main_plugin;
pub mod names;
pub mod netlink;
pub mod netns;
pub mod retry;
pub mod spec;
pub mod subnet;

use std::io::{Read, Write};
use std::panic::AssertUnwindSafe;

use serde_json::{Value, json};

use spec::NetConf;
use spec::env::{Command, Env};
use spec::error::{CniError, code};
use spec::version::{self, Version};

/// Which plugin an invocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plugin {
    Main,
    Ipam,
}

impl Plugin {
    /// `margay-ipam` by the name it was started under, else `margay`.
    pub fn from_argv0(argv0: &str) -> Plugin {
        let name = std::path::Path::new(argv0)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("");
        if name == spec::config::IPAM_TYPE {
            Plugin::Ipam
        } else {
            Plugin::Main
        }
    }
}

/// What an invocation asks for, validated (everything before touching the system).
#[derive(Debug)]
pub enum Request {
    /// VERSION: answered from what is known, with the version to echo.
    Version(String),
    Run {
        env: Box<Env>,
        conf: Box<NetConf>,
    },
}

/// Validates environment and configuration (sans IO). On error: the error and the cniVersion
/// to print it with.
pub fn prepare(
    stdin: &[u8],
    get: impl Fn(&str) -> Option<String>,
) -> Result<Request, (CniError, String)> {
    let err_version = || NetConf::version_for_errors(stdin);
    let env = Env::parse(get).map_err(|e| (e, err_version()))?;
    if env.command == Command::Version {
        // VERSION answers in the version it was asked in, whatever the rest of stdin holds.
        let asked = serde_json::from_slice::<Value>(stdin)
            .ok()
            .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_owned))
            .filter(|s| Version::parse(s).is_ok())
            .unwrap_or_else(|| Version::LATEST.to_string());
        return Ok(Request::Version(asked));
    }
    let conf = NetConf::parse(stdin).map_err(|e| (e, err_version()))?;
    let gate = |since: Version| -> Result<(), (CniError, String)> {
        if conf.version < since {
            Err((
                CniError::new(
                    code::INCOMPATIBLE_VERSION,
                    format!(
                        "{} does not exist in CNI {}; it needs {since} or later",
                        env.command.as_str(),
                        conf.cni_version
                    ),
                ),
                conf.cni_version.clone(),
            ))
        } else {
            Ok(())
        }
    };
    match env.command {
        Command::Check => gate(Version::V0_4_0)?,
        Command::Gc | Command::Status => gate(Version::V1_1_0)?,
        _ => {}
    }
    Ok(Request::Run {
        env: Box::new(env),
        conf: Box::new(conf),
    })
}

/// The VERSION answer.
pub fn version_answer(asked: &str) -> Value {
    json!({"cniVersion": asked, "supportedVersions": version::supported_strings()})
}

/// Runs one invocation of `plugin` from the process's stdin and environment; prints the result
/// or error on stdout; returns the exit code.
pub fn run(plugin: Plugin) -> i32 {
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        let err = CniError::new(
            code::IO,
            format!("cannot read the network configuration from stdin: {e}"),
        );
        return print_error(&err, &Version::LATEST.to_string());
    }
    let request = match prepare(&stdin, |k| std::env::var(k).ok()) {
        Ok(r) => r,
        Err((e, v)) => {
            if std::env::var_os("CNI_COMMAND").is_none() {
                eprintln!(
                    "margay CNI plugin {} (CNI {}); run by a container runtime with CNI_COMMAND set",
                    env!("CARGO_PKG_VERSION"),
                    version::supported_strings().join(", ")
                );
            }
            return print_error(&e, &v);
        }
    };
    let (env, conf) = match request {
        Request::Version(asked) => return print(&version_answer(&asked)),
        Request::Run { env, conf } => (env, conf),
    };
    logging::init(conf.log_level, conf.log_file.as_deref());
    // A panic is a bug, but the runtime still gets a CNI error object, not a backtrace.
    let outcome =
        std::panic::catch_unwind(AssertUnwindSafe(|| execute(plugin, &env, &conf, &stdin)))
            .unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown".into());
                Err(CniError::new(
                    code::INTERNAL,
                    format!("margay panicked: {what}"),
                ))
            });
    match outcome {
        Ok(Some(result)) => print(&result),
        Ok(None) => 0,
        Err(e) => {
            tracing::error!(
                command = env.command.as_str(),
                container = %env.container_id,
                code = e.code,
                "{}{}",
                e.msg,
                if e.details.is_empty() { String::new() } else { format!(" ({})", e.details) }
            );
            print_error(&e, &conf.cni_version)
        }
    }
}

/// Executes a validated request. Some(result) for ADD, None for the commands without output.
fn execute(
    plugin: Plugin,
    env: &Env,
    conf: &NetConf,
    stdin: &[u8],
) -> Result<Option<Value>, CniError> {
    // One thread: namespace switches (setns) are per thread, and a multi-thread runtime's
    // start-up would cost more than the whole gRPC call.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CniError::new(code::IO, format!("cannot start the async runtime: {e}")))?;
    let result = match (plugin, env.command) {
        (_, Command::Version) => None,
        (Plugin::Main, Command::Add) => Some(main_plugin::add(&rt, conf, env, stdin)?),
        (Plugin::Main, Command::Del) => {
            main_plugin::del(&rt, conf, env, stdin)?;
            None
        }
        (Plugin::Main, Command::Check) => {
            check::check(&rt, conf, env, stdin)?;
            None
        }
        (Plugin::Main, Command::Gc) => {
            main_plugin::gc(&rt, conf, env, stdin)?;
            None
        }
        (Plugin::Main, Command::Status) => {
            main_plugin::status(&rt, conf, env, stdin)?;
            None
        }
        (Plugin::Ipam, Command::Add) => {
            let mut bgpd = ipam_plugin::client(conf);
            let nets = rt.block_on(ipam_plugin::allocate(&mut bgpd, conf, env))?;
            match ipam_plugin::ipam_result(conf, &nets) {
                Ok(r) => {
                    tracing::info!(container = %env.container_id, addresses = ?nets, "IPAM ADD");
                    Some(r)
                }
                Err(e) => {
                    // Nothing half-done: the addresses go back with the error.
                    let _ = rt.block_on(ipam_plugin::release(&mut bgpd, conf, env));
                    return Err(e);
                }
            }
        }
        (Plugin::Ipam, Command::Del) => {
            let mut bgpd = ipam_plugin::client(conf);
            let released = rt.block_on(ipam_plugin::release(&mut bgpd, conf, env))?;
            tracing::info!(container = %env.container_id, ?released, "IPAM DEL");
            None
        }
        (Plugin::Ipam, Command::Check) => {
            let prev = conf.prev_result.as_ref().ok_or_else(|| {
                CniError::new(
                    code::INVALID_CONFIG,
                    "CHECK needs prevResult in the network configuration",
                )
            })?;
            let expected: Vec<_> = prev.ips.iter().map(|i| i.address.addr()).collect();
            let mut bgpd = ipam_plugin::client(conf);
            rt.block_on(ipam_plugin::verify(&mut bgpd, conf, env, &expected))?;
            None
        }
        (Plugin::Ipam, Command::Gc) => {
            let mut bgpd = ipam_plugin::client(conf);
            rt.block_on(ipam_plugin::collect(&mut bgpd, conf))?;
            None
        }
        (Plugin::Ipam, Command::Status) => {
            rt.block_on(crate::ipam_status::status(conf))?;
            None
        }
    };
    Ok(result.map(|r| r.to_json(conf.version, &conf.cni_version)))
}

fn print(v: &Value) -> i32 {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{v}").and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("margay: cannot write the result to stdout: {e}");
            1
        }
    }
}

fn print_error(e: &CniError, cni_version: &str) -> i32 {
    print(&e.to_json(cni_version));
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prep(cmd: &str, stdin: &str, drop: &[&str]) -> Result<Request, (CniError, String)> {
        let vars = [
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ];
        prepare(stdin.as_bytes(), |k| {
            vars.iter()
                .find(|(n, _)| *n == k && !drop.contains(n))
                .map(|(_, v)| v.to_string())
        })
    }

    const CONF: &str = r#"{"cniVersion":"1.1.0","name":"net","type":"margay"}"#;

    #[test]
    fn argv0_picks_the_plugin() {
        assert_eq!(Plugin::from_argv0("/opt/cni/bin/margay-ipam"), Plugin::Ipam);
        assert_eq!(Plugin::from_argv0("margay-ipam"), Plugin::Ipam);
        assert_eq!(Plugin::from_argv0("/opt/cni/bin/margay"), Plugin::Main);
        assert_eq!(Plugin::from_argv0(""), Plugin::Main);
    }

    #[test]
    fn version_needs_nothing_but_echoes_the_asked_version() {
        match prep(
            "VERSION",
            "",
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
        )
        .unwrap()
        {
            Request::Version(v) => assert_eq!(v, "1.1.0"),
            other => panic!("{other:?}"),
        }
        match prep("VERSION", r#"{"cniVersion":"0.4.0"}"#, &[]).unwrap() {
            Request::Version(v) => assert_eq!(v, "0.4.0"),
            other => panic!("{other:?}"),
        }
        let a = version_answer("1.0.0");
        assert_eq!(a["cniVersion"], "1.0.0");
        assert_eq!(a["supportedVersions"].as_array().unwrap().len(), 5);
    }

    #[test]
    fn commands_gated_by_version() {
        let conf = |v: &str| CONF.replace("1.1.0", v);
        for (cmd, ver, ok) in [
            ("CHECK", "0.3.1", false),
            ("CHECK", "0.4.0", true),
            ("GC", "1.0.0", false),
            ("GC", "1.1.0", true),
            ("STATUS", "0.4.0", false),
            ("STATUS", "1.1.0", true),
            ("ADD", "0.3.0", true),
            ("DEL", "0.3.1", true),
        ] {
            match (prep(cmd, &conf(ver), &[]), ok) {
                (Ok(_), true) => {}
                (Err((e, v)), false) => {
                    assert_eq!(e.code, code::INCOMPATIBLE_VERSION, "{cmd} {ver}");
                    assert!(e.msg.contains(cmd), "{}", e.msg);
                    assert_eq!(v, ver);
                }
                (got, _) => panic!("{cmd} {ver}: {got:?}"),
            }
        }
    }

    #[test]
    fn errors_carry_a_printable_version() {
        let (e, v) = prep("ADD", "{not json", &[]).unwrap_err();
        assert_eq!(e.code, code::DECODE);
        assert_eq!(v, "1.1.0");
        let (e, v) = prep("ADD", &CONF.replace("1.1.0", "0.4.0"), &["CNI_NETNS"]).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        assert_eq!(v, "0.4.0");
        let (e, _) = prep("ADD", &CONF.replace("1.1.0", "7.0.0"), &[]).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        let (e, _) = prep("ADD", CONF, &["CNI_CONTAINERID"]).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        assert!(e.msg.contains("CNI_CONTAINERID"));
        // DEL works without a namespace.
        assert!(prep("DEL", CONF, &["CNI_NETNS"]).is_ok());
    }
}
