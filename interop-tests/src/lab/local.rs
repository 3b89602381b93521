//! A driver of `margay-lab` (the README's local cluster) for tests: a lab of the test's own
//! name (`MARGAY_LAB_NAME`), its commands, its namespaces, its nodes' sockets and pods. The
//! lab is taken down when the driver is dropped, unless it was made with [`LocalLab::borrow`].

use std::path::PathBuf;
use std::process::Command;

pub struct LocalLab {
    pub name: String,
    owner: bool,
}

impl LocalLab {
    /// A lab named `name` (short: it prefixes namespace names), taken down on drop.
    pub fn new(name: &str) -> LocalLab {
        LocalLab {
            name: name.to_owned(),
            owner: true,
        }
    }

    /// Another handle on the same lab (for a thread), which leaves it up when dropped.
    pub fn borrow(&self) -> LocalLab {
        LocalLab {
            name: self.name.clone(),
            owner: false,
        }
    }

    /// Runs `margay-lab args`: whether it succeeded, and everything it printed.
    pub fn run(&self, args: &[&str]) -> (bool, String) {
        captured(
            Command::new(super::binary("margay-lab"))
                .args(args)
                .env("MARGAY_LAB_NAME", &self.name),
        )
    }

    /// As [`run`](Self::run), panicking with node-1's bgpd log when it fails.
    pub fn ok(&self, args: &[&str]) -> String {
        let (ok, text) = self.run(args);
        if !ok {
            let log = std::fs::read_to_string(self.node_dir("node-1").join("bgpd.log"))
                .unwrap_or_default();
            panic!("margay-lab {args:?} failed:\n{text}\nnode-1's bgpd log:\n{log}");
        }
        text
    }

    /// The full name of one of the lab's namespaces (`node-1`, `router`, `node-1-a`).
    pub fn ns(&self, short: &str) -> String {
        format!("{}-{short}", self.name)
    }

    /// A node's state folder.
    pub fn node_dir(&self, node: &str) -> PathBuf {
        PathBuf::from(format!("/run/margay-lab-{}/{node}", self.name))
    }

    /// A node's bgpd API socket.
    pub fn socket(&self, node: &str) -> PathBuf {
        self.node_dir(node).join("bgpd.sock")
    }

    /// Runs a command inside one of the lab's namespaces: success, and what it printed.
    pub fn exec(&self, short: &str, args: &[&str]) -> (bool, String) {
        captured(
            Command::new("ip")
                .args(["netns", "exec", &self.ns(short)])
                .args(args),
        )
    }

    /// `bgpctl --socket <node's> args`: success, and what it printed.
    pub fn bgpctl(&self, node: &str, args: &[&str]) -> (bool, String) {
        captured(
            Command::new(super::binary("bgpctl"))
                .arg("--socket")
                .arg(self.socket(node))
                .args(args),
        )
    }

    /// A pod's IPv4 address from `margay-lab status`.
    pub fn pod_address(&self, pod: &str) -> String {
        self.pod_column(pod, 0)
    }

    /// A pod's IPv6 address from `margay-lab status`.
    pub fn pod_address6(&self, pod: &str) -> String {
        self.pod_column(pod, 1)
    }

    fn pod_column(&self, pod: &str, column: usize) -> String {
        let status = self.ok(&["status"]);
        status
            .lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some("pod") && w.next() == Some(pod))
                    .then(|| w.nth(column).unwrap().to_owned())
            })
            .unwrap_or_else(|| panic!("no pod {pod} in:\n{status}"))
    }
}

/// Runs `cmd` to its end: whether it succeeded, and its stdout then stderr.
/// Runs `cmd` to its end: whether it succeeded, and its stdout and stderr together.
pub fn captured(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", cmd.get_program()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

impl Drop for LocalLab {
    fn drop(&mut self) {
        if self.owner {
            let _ = self.run(&["down"]);
        }
    }
}
