//! Real container runtimes for tests, as their users run them: containerd (with runc, its `ctr`
//! client and its CRI) and Podman (rootful, CNI backend). Each gets its own state, storage and
//! socket directories under the test's folder, its own CNI configuration and plugin
//! directories (filled by `margay-cni-install`, as a user installs margay), and runs in a lab
//! node's network namespace, so the pods it makes hang off that node.
//!
//! Boundaries: this module starts and stops the runtimes and builds what they need (a root
//! file system and an image from busybox-static; nothing is pulled); the scenarios are in
//! `tests/runtimes.rs`. Processes are ended by PID, mounts undone and folders removed on drop.

pub mod containerd;
pub mod cri;
pub mod image;
pub mod podman;

use std::path::{Path, PathBuf};
use std::process::Command;

use super::netns::{CmdError, run};

/// The reference plugins a runtime's conflist may chain (Debian's containernetworking-plugins).
pub const REFERENCE_PLUGINS: &str = "/usr/lib/cni";

/// A runtime's CNI directories: the plugins it may exec and the configurations it reads.
#[derive(Debug, Clone)]
pub struct CniDirs {
    pub bin: PathBuf,
    pub conf: PathBuf,
}

/// What `margay-cni-install` is told for one node.
#[derive(Debug, Clone)]
pub struct Install<'a> {
    /// The network's name (the conflist's `name`, Podman's network name).
    pub network: &'a str,
    /// The node's bgpd API socket.
    pub socket: &'a Path,
    /// The node's name as bgpd knows it.
    pub nodename: &'a str,
    pub log_file: &'a Path,
}

impl CniDirs {
    /// Installs margay as a user does: `margay-cni-install` puts `margay` and `margay-ipam` in
    /// `<root>/bin` and the conflist (margay, portmap, bandwidth) in `<root>/net.d`; the
    /// reference plugins it chains are linked beside them, as their package would install them.
    pub fn install(root: &Path, how: &Install<'_>) -> Result<CniDirs, String> {
        let dirs = CniDirs {
            bin: root.join("bin"),
            conf: root.join("net.d"),
        };
        let from = super::binary("margay");
        let from = from.parent().unwrap_or(Path::new("."));
        run(Command::new(super::binary("margay-cni-install"))
            .arg("--from")
            .arg(from)
            .arg("--bin-dir")
            .arg(&dirs.bin)
            .arg("--conf-dir")
            .arg(&dirs.conf)
            .args(["--network-name", how.network, "--nodename", how.nodename])
            .arg("--socket")
            .arg(how.socket)
            .arg("--log-file")
            .arg(how.log_file)
            .args(["--log-level", "debug"]))
        .map_err(|e| e.to_string())?;
        dirs.link_reference_plugins()?;
        Ok(dirs)
    }

    /// Directories for the reference plugins alone (the baseline: ptp + host-local).
    pub fn reference_only(root: &Path, conflist: &serde_json::Value) -> Result<CniDirs, String> {
        let dirs = CniDirs {
            bin: root.join("bin"),
            conf: root.join("net.d"),
        };
        for d in [&dirs.bin, &dirs.conf] {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        let name = conflist["name"].as_str().unwrap_or("net");
        let path = dirs.conf.join(format!("10-{name}.conflist"));
        std::fs::write(&path, conflist.to_string())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        dirs.link_reference_plugins()?;
        Ok(dirs)
    }

    fn link_reference_plugins(&self) -> Result<(), String> {
        let entries = std::fs::read_dir(REFERENCE_PLUGINS).map_err(|e| {
            format!("{REFERENCE_PLUGINS}: {e} (install Debian's containernetworking-plugins)")
        })?;
        for entry in entries.flatten() {
            let target = self.bin.join(entry.file_name());
            if !target.exists() {
                std::os::unix::fs::symlink(entry.path(), &target)
                    .map_err(|e| format!("{}: {e}", target.display()))?;
            }
        }
        Ok(())
    }

    /// The one conflist in `conf`, parsed.
    pub fn conflist(&self) -> Result<serde_json::Value, String> {
        let entries =
            std::fs::read_dir(&self.conf).map_err(|e| format!("{}: {e}", self.conf.display()))?;
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "conflist") {
                let text = std::fs::read_to_string(e.path()).map_err(|e| e.to_string())?;
                return serde_json::from_str(&text).map_err(|e| e.to_string());
            }
        }
        Err(format!("no conflist in {}", self.conf.display()))
    }
}

/// The PIDs of processes whose command line contains `needle` (e.g. a runtime's socket path,
/// which its shims and monitors carry): how the leftovers of a runtime are found and ended.
pub fn pids_with_arg(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    let me = std::process::id() as i32;
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(needle) {
            out.push(pid);
        }
    }
    out
}

/// SIGKILLs `pids` and waits (up to 5 s) until none is left.
pub fn kill_and_wait(pids: &[i32]) {
    for &pid in pids {
        // SAFETY: kill(2) on processes this test's runtime started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline
        && pids
            .iter()
            .any(|p| Path::new(&format!("/proc/{p}")).exists() && !is_zombie(*p))
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(true)
}

/// Unmounts every mount point under `dir`, deepest first (a runtime's snapshots and netns
/// bind mounts), so the folder can be removed.
pub fn unmount_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let prefix = dir.display().to_string();
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount").arg("-l").arg(&p).status();
    }
}

/// A command run inside namespace `netns` with nothing else changed: unlike `ip netns exec`,
/// `nsenter --net` leaves the mount namespace (and so the cgroup mounts runc needs) alone.
pub fn in_netns(netns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/run/netns/{netns}")).arg(program);
    c
}

/// Runs `cmd`; stdout, or an error with stderr.
pub fn output(cmd: &mut Command) -> Result<String, String> {
    run(cmd).map_err(|e: CmdError| e.to_string())
}

/// margay installed for a lab node under `root` (`cni-<node>`, its log `cni-<node>.log`), as a
/// user installs it on that node.
pub fn install_on(
    lab: &super::local::LocalLab,
    root: &Path,
    node: &str,
    network: &str,
) -> Result<CniDirs, String> {
    CniDirs::install(
        &root.join(format!("cni-{node}")),
        &Install {
            network,
            socket: &lab.socket(node),
            nodename: node,
            log_file: &root.join(format!("cni-{node}.log")),
        },
    )
    .map_err(|e| format!("margay-cni-install for {node}: {e}"))
}

/// `bgpctl ipam gc` on `node` for the handles of `network`: with `live` (container ids, as
/// the runtime lists them) it releases every other; with `dry_run` it only says what it would.
fn ipam_gc(
    lab: &super::local::LocalLab,
    node: &str,
    network: &str,
    live: &[String],
    dry_run: bool,
) -> Result<String, String> {
    let prefix = format!("{network}.");
    let live: Vec<String> = live.iter().map(|id| format!("{prefix}{id}")).collect();
    let live = live.join(",");
    let mut args = vec![
        "ipam", "gc", "--node", node, "--prefix", &prefix, "--live", &live, "--json",
    ];
    if dry_run {
        args.push("--dry-run");
    }
    match lab.bgpctl(node, &args) {
        (true, out) => Ok(out),
        (false, out) => Err(format!("bgpctl {}: {out}", args.join(" "))),
    }
}

/// The addresses `node`'s handles of `network` hold (a dry-run GC with no live container
/// lists every one).
pub fn held(
    lab: &super::local::LocalLab,
    node: &str,
    network: &str,
) -> Result<Vec<String>, String> {
    released(&ipam_gc(lab, node, network, &[], true)?)
}

/// margay's GC against a runtime's list of live containers (what a node agent does where the
/// runtime does not call CNI GC): every handle of `network` on `node` not live is released;
/// the addresses released.
pub fn gc_against(
    lab: &super::local::LocalLab,
    node: &str,
    network: &str,
    live: &[String],
) -> Result<Vec<String>, String> {
    released(&ipam_gc(lab, node, network, live, false)?)
}

/// The addresses of `ipam gc --json`'s answer.
fn released(json: &str) -> Result<Vec<String>, String> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| format!("{e}: {json}"))?;
    Ok(v["released"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|h| h["addresses"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect())
}
