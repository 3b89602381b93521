//! containerd 1.6 with runc, in a lab node's network namespace: its own root, state and socket
//! under the test's folder, its CRI plugin pointed at the node's CNI directories, a random
//! streaming port (two of them run at once), and `ctr` as its users call it.
//!
//! `ctr run --cni` calls the CNI plugins itself, from the fixed `/etc/cni/net.d` and
//! `/opt/cni/bin`; so that it reads this node's directories and nothing of the machine's, each
//! `ctr` runs in a private mount namespace with the node's directories bound over those two.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{CniDirs, in_netns, kill_and_wait, output, pids_with_arg, unmount_under};

/// The containerd namespace the CRI uses.
pub const CRI_NAMESPACE: &str = "k8s.io";

/// Where `ctr run --cni` looks (fixed in ctr 1.6).
const CTR_CNI_CONF: &str = "/etc/cni/net.d";
const CTR_CNI_BIN: &str = "/opt/cni/bin";

pub struct Containerd {
    pub dir: PathBuf,
    pub netns: String,
    pub socket: PathBuf,
    pub cni: CniDirs,
    process: Child,
}

impl Containerd {
    /// Starts containerd in `netns` with everything under `dir`; waits for its socket.
    pub fn start(
        dir: &Path,
        netns: &str,
        cni: &CniDirs,
        sandbox_image: &str,
    ) -> Result<Containerd, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let socket = dir.join("containerd.sock");
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = "{sock}.debug"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false
  restrict_oom_score_adj = true
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{bin}"
  conf_dir = "{conf}"
  max_conf_num = 1
"#,
            root = dir.join("root").display(),
            state = dir.join("state").display(),
            sock = socket.display(),
            bin = cni.bin.display(),
            conf = cni.conf.display(),
        );
        let config_path = dir.join("config.toml");
        std::fs::write(&config_path, config).map_err(|e| e.to_string())?;
        let process = spawn(dir, netns)?;
        let mut c = Containerd {
            dir: dir.to_owned(),
            netns: netns.to_owned(),
            socket,
            cni: cni.clone(),
            process,
        };
        c.wait_ready()?;
        Ok(c)
    }

    /// Waits (20 s) until containerd answers.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.ctr(&["version"]).is_ok() {
                return Ok(());
            }
            if let Ok(Some(status)) = self.process.try_wait() {
                return Err(format!(
                    "containerd exited ({status}) at start: {}",
                    self.log_tail()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "containerd did not answer in 20 s: {}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// kill -9 of containerd alone (its shims and containers live on, as after a crash).
    pub fn crash(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }

    /// Starts containerd again on the same folders, after [`crash`](Self::crash) or
    /// [`reboot`](Self::reboot).
    pub fn start_again(&mut self) -> Result<(), String> {
        self.process = spawn(&self.dir, &self.netns)?;
        self.wait_ready()
    }

    /// What a host's reboot does to containerd: every container, shim and containerd itself
    /// killed, its state directory (a tmpfs on a host) and the network namespaces it pinned
    /// (`netns`, in /run) gone; its root directory (on disk) kept.
    pub fn reboot(&mut self, netns: &[String]) {
        let mut pids = Vec::new();
        for ns in ["default", CRI_NAMESPACE] {
            pids.extend(self.task_pids(ns));
        }
        self.crash();
        pids.extend(pids_with_arg(&self.socket.display().to_string()));
        kill_and_wait(&pids);
        unmount_under(&self.dir.join("state"));
        let _ = std::fs::remove_dir_all(self.dir.join("state"));
        for n in netns {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }

    /// The PIDs of the tasks in a containerd namespace (`ctr tasks ls`).
    pub fn task_pids(&self, ns: &str) -> Vec<i32> {
        self.ctr(&["-n", ns, "tasks", "ls"])
            .unwrap_or_default()
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
            .filter(|p: &i32| *p > 0)
            .collect()
    }

    pub fn pid(&self) -> i32 {
        self.process.id() as i32
    }

    /// The end of containerd's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// A `ctr` command in the node's namespace, with the node's CNI directories where ctr
    /// looks for them.
    pub fn ctr_command(&self, args: &[&str]) -> Command {
        let script = format!(
            "mount --bind '{conf}' {CTR_CNI_CONF} && mount --bind '{bin}' {CTR_CNI_BIN} && exec ctr -a '{sock}' \"$@\"",
            conf = self.cni.conf.display(),
            bin = self.cni.bin.display(),
            sock = self.socket.display(),
        );
        let mut c = in_netns(&self.netns, "unshare");
        c.args(["-m", "--propagation", "private", "sh", "-c", &script, "ctr"])
            .args(args);
        c
    }

    /// Runs `ctr args` to its end; its stdout.
    pub fn ctr(&self, args: &[&str]) -> Result<String, String> {
        ensure_ctr_dirs()?;
        output(&mut self.ctr_command(args))
    }

    /// `ctr run --cni --rootfs ROOTFS ID cmd...` in the foreground, as a user runs a container
    /// and leaves it: the child ends when the task ends, after ctr's CNI DEL.
    pub fn ctr_run(&self, rootfs: &Path, id: &str, cmd: &[&str]) -> Result<Child, String> {
        ensure_ctr_dirs()?;
        let rootfs = rootfs.display().to_string();
        let mut args = vec!["run", "--cni", "--rootfs", &rootfs, id];
        args.extend_from_slice(cmd);
        let log = std::fs::File::create(self.dir.join(format!("ctr-{id}.log")))
            .map_err(|e| e.to_string())?;
        self.ctr_command(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("ctr run {id}: {e}"))
    }

    /// A kubelet's client of the CRI (containerd's own socket serves it).
    pub fn cri(&self) -> Result<super::cri::Cri, String> {
        super::cri::Cri::connect(&self.socket)
    }

    /// Stops and removes every pod sandbox through the CRI, as a kubelet's teardown does:
    /// that runs the CNI DEL and removes the sandbox's network namespace (the CRI pins it
    /// under /run/netns, which outlives containerd otherwise).
    pub fn remove_sandboxes(&self) -> Result<usize, String> {
        let mut cri = super::cri::Cri::connect(&self.socket)?;
        let ids = cri.sandboxes()?;
        for id in &ids {
            let _ = cri.stop_sandbox(id);
            let _ = cri.remove_sandbox(id);
        }
        Ok(ids.len())
    }

    /// Removes the CRI's pods, ends every task in the default and CRI namespaces, then
    /// containerd, then what is left of its shims; unmounts what it mounted.
    fn stop(&mut self) {
        let _ = self.remove_sandboxes();
        for ns in ["default", CRI_NAMESPACE] {
            if let Ok(list) = self.ctr(&["-n", ns, "tasks", "ls", "-q"]) {
                for id in list.lines().filter(|l| !l.is_empty()) {
                    let _ = self.ctr(&["-n", ns, "tasks", "kill", "-s", "KILL", id]);
                }
            }
        }
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(self.process.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.process.kill();
        let _ = self.process.wait();
        kill_and_wait(&pids_with_arg(&self.socket.display().to_string()));
        unmount_under(&self.dir);
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// containerd on the configuration in `dir`, in `netns`, its output appended to its log.
fn spawn(dir: &Path, netns: &str) -> Result<Child, String> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("containerd.log"))
        .map_err(|e| e.to_string())?;
    in_netns(netns, "containerd")
        .arg("--config")
        .arg(dir.join("config.toml"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("starting containerd (install Debian's containerd): {e}"))
}

/// ctr's fixed CNI directories exist as bind-mount targets (as a CNI install makes them).
fn ensure_ctr_dirs() -> Result<(), String> {
    for d in [CTR_CNI_CONF, CTR_CNI_BIN] {
        std::fs::create_dir_all(d).map_err(|e| format!("{d}: {e}"))?;
    }
    Ok(())
}
