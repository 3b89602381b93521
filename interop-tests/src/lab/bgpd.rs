//! A real bgpd process with a configuration in a temporary directory, killed by PID when
//! dropped, and bgpctl run against it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::binary;

/// A bgpd child process, killed (by PID) when dropped.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Daemon {
    /// Writes `extra` after a minimal configuration into a fresh directory and starts bgpd.
    pub fn start(extra: &str) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("run/bgpd.sock");
        Self::start_in(dir, socket, extra)
    }

    pub fn start_in(dir: tempfile::TempDir, socket: PathBuf, extra: &str) -> Daemon {
        let config = write_config(dir.path(), &socket, extra);
        Self::start_with_config(dir, socket, &config)
    }

    /// Starts bgpd with a configuration file written by the caller. Its log goes to
    /// `bgpd.log` in `dir` (a pipe nobody reads would stall it).
    pub fn start_with_config(dir: tempfile::TempDir, socket: PathBuf, config: &Path) -> Daemon {
        let log = std::fs::File::create(dir.path().join("bgpd.log")).unwrap();
        let child = command(config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut d = Daemon { child, socket, dir };
        d.wait_ready();
        d
    }

    /// bgpd as the node `name` (at `address`, a CIDR) on the Kubernetes datastore of
    /// `kubeconfig`, on a BGP port of its own (so several share a host); its configuration
    /// file is `bgpd.toml` in its directory.
    pub fn on_kubernetes(kubeconfig: &Path, name: &str, address: &str) -> Daemon {
        Self::on_kubernetes_with(kubeconfig, name, address, "")
    }

    /// [`Daemon::on_kubernetes`] with `extra` at the end of its configuration.
    pub fn on_kubernetes_with(kubeconfig: &Path, name: &str, address: &str, extra: &str) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("bgpd.sock");
        let config = dir.path().join("bgpd.toml");
        std::fs::write(
            &config,
            format!(
                "[node]\nname = \"{name}\"\naddress = \"{address}\"\n\
                 [datastore]\nkind = \"kubernetes\"\nkubeconfig = \"{}\"\n\
                 [api]\nsocket = \"{}\"\n[bgp]\nlisten_port = {}\n{extra}",
                kubeconfig.display(),
                socket.display(),
                super::free_port()
            ),
        )
        .unwrap();
        Daemon::start_with_config(dir, socket, &config)
    }

    /// The configuration file of a daemon made by [`Daemon::on_kubernetes`].
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("bgpd.toml")
    }

    /// Starts bgpd again with `config` once the last process has ended (it is reaped here,
    /// killed if it still runs); its log goes on in the same `bgpd.log`.
    pub fn restart(&mut self, config: &Path) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let log = std::fs::File::options()
            .append(true)
            .open(self.dir.path().join("bgpd.log"))
            .unwrap();
        self.child = command(config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.wait_ready();
    }

    /// What bgpd logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("bgpd.log")).unwrap_or_default()
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("bgpd exited early with {status}: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("bgpd did not open {} within 20 s", self.socket.display());
    }

    /// `bgpctl args` against this bgpd, which must succeed; its stdout. A failure shows
    /// bgpctl's stderr and bgpd's log.
    pub fn bgpctl_ok(&self, args: &[&str]) -> String {
        let out = bgpctl(&self.socket, args);
        assert!(
            out.status.success(),
            "bgpctl {args:?}: {}\nbgpd's log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// [`Daemon::bgpctl_ok`] with `--json`, parsed.
    pub fn bgpctl_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.push("--json");
        serde_json::from_str(&self.bgpctl_ok(&all)).unwrap()
    }

    /// `bgpctl ARGS` with `stdin` on its standard input (for `apply -f -`): (success,
    /// stdout, stderr).
    pub fn ctl_io(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        use std::io::Write;
        let mut child = Command::new(binary("bgpctl"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(input);
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    }

    /// [`Daemon::ctl_io`], which must succeed: its stdout.
    pub fn ctl_io_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (success, out, err) = self.ctl_io(args, stdin);
        assert!(
            success,
            "bgpctl {args:?}: {err}\nbgpd's log:\n{}",
            self.log()
        );
        out
    }

    /// [`Daemon::ctl_io`], which must fail: its stderr.
    pub fn ctl_io_fails(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (success, out, err) = self.ctl_io(args, stdin);
        assert!(!success, "bgpctl {args:?} succeeded: {out}");
        err
    }

    /// `bgpctl ARGS -o json` (the resource commands' flag), parsed.
    pub fn ctl_o_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.ctl_io_ok(&all, None)).unwrap()
    }

    /// `bgpctl args`, which must fail with exit code 1 and one line on stderr; that line.
    pub fn bgpctl_fails(&self, args: &[&str]) -> String {
        let out = bgpctl(&self.socket, args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "bgpctl {args:?} should fail: {out:?}"
        );
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        err
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends a signal and waits for the process to end.
    pub fn signal_and_wait(&mut self, signal: i32) -> std::process::ExitStatus {
        unsafe { libc::kill(self.pid(), signal) };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "bgpd did not stop after signal {signal}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts bgpd with a configuration in `dir` without waiting for it, stdout and stderr piped
/// (for runs expected to end by themselves). See `write_config` for `extra`.
pub fn spawn(dir: &Path, socket: &Path, extra: &str) -> Child {
    let config = write_config(dir, socket, extra);
    command(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Writes a minimal configuration into `dir`. `extra` is appended right after the `[api]`
/// section's socket line: it may add keys to `[api]` and then sections.
pub fn write_config(dir: &Path, socket: &Path, extra: &str) -> PathBuf {
    write_config_with_node(dir, socket, "", extra)
}

/// As [`write_config`], with `node_extra` (keys, e.g. `address6 = "fd99::1/64"`) added to the
/// `[node]` section, which `extra` cannot reopen (TOML forbids defining a table twice).
pub fn write_config_with_node(dir: &Path, socket: &Path, node_extra: &str, extra: &str) -> PathBuf {
    let config = dir.join("bgpd.toml");
    std::fs::write(
        &config,
        format!(
            "[node]\nname = \"test-node\"\naddress = \"10.0.0.5/24\"\n{node_extra}\
             [datastore]\npath = \"{}\"\n\
             [api]\nsocket = \"{}\"\n{extra}",
            dir.join("store.db").display(),
            socket.display()
        ),
    )
    .unwrap();
    config
}

/// bgpd with a configuration file; no MARGAY_ variables from the test's environment.
fn command(config: &Path) -> Command {
    let mut c = Command::new(binary("bgpd"));
    c.arg("--config").arg(config);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("MARGAY_") {
            c.env_remove(k);
        }
    }
    c.stdin(Stdio::null());
    c
}

/// `margay-ipam` with `command` (ADD, DEL) for the pod `id` of `node`, as a runtime runs it
/// (the CNI variables, the network's configuration on stdin) against the bgpd at `socket`;
/// the running child, its stdout and stderr piped.
pub fn ipam_plugin(command: &str, id: &str, node: &str, socket: &Path) -> Child {
    ipam_plugin_for(command, id, ("default", id), node, socket)
}

/// [`ipam_plugin`] for the container `id` of pod `(namespace, pod)`.
pub fn ipam_plugin_for(
    command: &str,
    id: &str,
    (namespace, pod): (&str, &str),
    node: &str,
    socket: &Path,
) -> Child {
    use std::io::Write;
    let conf = serde_json::json!({
        "cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "ptp",
        "nodename": node,
        "ipam": {"type": "margay-ipam", "socket": socket},
    });
    let mut child = Command::new(binary("margay-ipam"))
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", "/run/netns/none")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/usr/lib/cni")
        .env(
            "CNI_ARGS",
            format!("K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod}"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    child
}

/// Runs bgpctl with `args` against `socket`.
pub fn bgpctl(socket: &Path, args: &[&str]) -> Output {
    Command::new(binary("bgpctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

/// A tokio runtime for the async parts of a test. Its worker keeps client connections alive
/// (answering pings) while the test thread waits on something else.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}
