//! Starting and stopping a real bgpd binary for the tests in this folder.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BGPD: &str = env!("CARGO_BIN_EXE_bgpd");
pub const BGPCTL: &str = env!("CARGO_BIN_EXE_bgpctl");

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
        let child = spawn(dir.path(), &socket, extra);
        let mut d = Daemon { child, socket, dir };
        d.wait_ready();
        d
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("bgpd exited early with {status}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("bgpd did not open {} within 20 s", self.socket.display());
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

/// Starts bgpd with a configuration in `dir` without waiting for it. `extra` is appended
/// right after the `[api]` section's socket line: it may add keys to `[api]` and then sections.
pub fn spawn(dir: &Path, socket: &Path, extra: &str) -> Child {
    let config = dir.join("bgpd.toml");
    std::fs::write(
        &config,
        format!(
            "[node]\nname = \"test-node\"\naddress = \"10.0.0.5/24\"\n\
             [datastore]\npath = \"{}\"\n\
             [api]\nsocket = \"{}\"\n{extra}",
            dir.join("store.db").display(),
            socket.display()
        ),
    )
    .unwrap();
    Command::new(BGPD)
        .arg("--config")
        .arg(&config)
        .env_remove("MARGAY_API__SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs bgpctl with `args` against `socket`.
pub fn bgpctl(socket: &Path, args: &[&str]) -> Output {
    Command::new(BGPCTL)
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
