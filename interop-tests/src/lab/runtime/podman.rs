//! Podman 4.3, rootful, with its CNI backend, in a lab node's network namespace: its own
//! storage root, run root, temporary and CNI directories through a containers.conf and a
//! storage.conf of the test's own (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF), nothing of the
//! machine's configuration read.
//!
//! runc cannot raise resource limits in this sandbox, so the containers.conf sets
//! `default_ulimits` to what the sandbox allows; without it every `podman run` fails with
//! "error setting rlimit".

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{CniDirs, in_netns, kill_and_wait, output, pids_with_arg, unmount_under};

pub struct Podman {
    pub dir: PathBuf,
    pub netns: String,
    pub cni: CniDirs,
}

impl Podman {
    /// Writes Podman's configuration under `dir` and checks it picks the CNI backend.
    pub fn new(dir: &Path, netns: &str, cni: &CniDirs) -> Result<Podman, String> {
        for sub in ["root", "runroot", "tmp", "volumes"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| e.to_string())?;
        }
        let conf = format!(
            r#"[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
netns = "private"
log_driver = "k8s-file"

[network]
network_backend = "cni"
cni_plugin_dirs = ["{bin}"]
network_config_dir = "{conf}"
default_network = "podman-unused"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{dir}/events.log"
tmp_dir = "{dir}/tmp"
volume_path = "{dir}/volumes"
static_dir = "{dir}/root/libpod"
"#,
            bin = cni.bin.display(),
            conf = cni.conf.display(),
            dir = dir.display(),
        );
        std::fs::write(dir.join("containers.conf"), conf).map_err(|e| e.to_string())?;
        let storage = format!(
            "[storage]\ndriver = \"overlay\"\nrunroot = \"{}\"\ngraphroot = \"{}\"\n",
            dir.join("runroot").display(),
            dir.join("root").display()
        );
        std::fs::write(dir.join("storage.conf"), storage).map_err(|e| e.to_string())?;
        // No registries: images come from `podman import`.
        std::fs::write(
            dir.join("registries.conf"),
            "unqualified-search-registries = []\n",
        )
        .map_err(|e| e.to_string())?;
        let p = Podman {
            dir: dir.to_owned(),
            netns: netns.to_owned(),
            cni: cni.clone(),
        };
        let backend = p.run(&["info", "--format", "{{.Host.NetworkBackend}}"])?;
        if backend.trim() != "cni" {
            return Err(format!(
                "podman picked network backend {:?}, not cni",
                backend.trim()
            ));
        }
        Ok(p)
    }

    /// A `podman` command with this instance's configuration, in the node's namespace.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = in_netns(&self.netns, "podman");
        c.env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.dir.join("storage.conf"))
            .env(
                "CONTAINERS_REGISTRIES_CONF",
                self.dir.join("registries.conf"),
            )
            .args(args);
        c
    }

    /// Runs `podman args` to its end; its stdout.
    pub fn run(&self, args: &[&str]) -> Result<String, String> {
        output(&mut self.command(args))
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "--force", "--time", "0"]);
        let _ = self.run(&["system", "reset", "--force"]);
        // conmon and whatever else carries our folder in its arguments.
        kill_and_wait(&pids_with_arg(&self.dir.display().to_string()));
        unmount_under(&self.dir);
    }
}
