//! Real etcd (Debian's etcd-server) on loopback: one member or a cluster, each with a temporary
//! data directory, killed by PID when dropped. Members can be killed and restarted on the same
//! data directory to test what survives.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

/// Where Debian installs etcd.
pub const ETCD: &str = "/usr/bin/etcd";

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data: PathBuf,
    child: Option<Child>,
}

/// Adds the arguments naming one member to an etcd command: its name and data directory, the
/// client URL it listens on and advertises, the peer URL likewise, and timings for a loopback
/// or in-machine network (a new leader in well under a second after a kill), logging warnings
/// only. The caller adds `--initial-cluster*` (a lone member needs none) and what to run it in.
pub fn member_args(cmd: &mut Command, name: &str, data: &Path, client: &str, peer: &str) {
    cmd.args(["--name", name])
        .arg("--data-dir")
        .arg(data)
        .args([
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
        ])
        .args([
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
        ])
        .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
        .args(["--log-level", "warn"]);
}

/// An etcd cluster of one or more members on 127.0.0.1.
pub struct EtcdCluster {
    members: Vec<Member>,
    initial_cluster: String,
    token: String,
    _dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `n` members and waits until the cluster answers.
    pub fn start(n: usize) -> Self {
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        Self::start_on(&ports)
    }

    /// Starts one member per client port given.
    pub fn start_on(client_ports: &[u16]) -> Self {
        let n = client_ports.len();
        assert!(
            std::path::Path::new(ETCD).exists(),
            "{ETCD} is missing: apt-get install etcd-server (scripts/test does)"
        );
        let dir = tempfile::tempdir().expect("a temporary directory");
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: client_ports[i],
                peer_port: free_port(),
                data: dir.path().join(format!("m{i}")),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Self {
            members,
            initial_cluster,
            token: format!("margay-{}-{}", std::process::id(), free_port()),
            _dir: dir,
        };
        for i in 0..n {
            cluster.spawn(i, "new");
        }
        cluster.wait_ready();
        cluster
    }

    /// Client URLs of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect()
    }

    fn spawn(&mut self, i: usize, state: &str) {
        let m = &mut self.members[i];
        std::fs::create_dir_all(&m.data).expect("member data dir");
        let log = std::fs::File::create(m.data.with_extension("log")).expect("member log");
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let mut cmd = Command::new(ETCD);
        member_args(&mut cmd, &m.name, &m.data, &client, &peer);
        let child = cmd
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", &self.token])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd starts");
        m.child = Some(child);
    }

    /// A store on this cluster, once it answers (a new cluster elects a leader first).
    pub async fn store(&self, options: datastore::etcd::EtcdOptions) -> datastore::etcd::EtcdStore {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match datastore::etcd::EtcdStore::connect(&self.endpoints(), options.clone()).await {
                Ok(store) => return store,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("etcd at {:?} does not answer: {e}", self.endpoints()),
            }
        }
    }

    /// Kills member `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i, "existing");
    }

    /// Waits until every running member accepts TCP connections on its client port. A member
    /// that exits meanwhile fails the wait at once, with the end of its log.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for m in self.members.iter_mut() {
            let Some(child) = m.child.as_mut() else {
                continue;
            };
            while std::net::TcpStream::connect(("127.0.0.1", m.client_port)).is_err() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "etcd {} exited ({status}) before it answered on port {}: {}",
                        m.name,
                        m.client_port,
                        log_tail(&m.data.with_extension("log"))
                    );
                }
                assert!(
                    Instant::now() < deadline,
                    "etcd {} did not answer on port {} in 30 s: {}",
                    m.name,
                    m.client_port,
                    log_tail(&m.data.with_extension("log"))
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The last lines of a member's log, for a failure message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("(no log: {e})"));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
