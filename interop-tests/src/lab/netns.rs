//! Network namespaces for tests and benchmarks: named with a per-run prefix (`mgy<pid>-<name>`)
//! so parallel runs never meet, joined by veth pairs, with commands run inside them through
//! `ip netns exec` or code run inside them on a thread that entered them (`setns`).
//!
//! Everything made here is removed when its owner is dropped, also when a test panics: a
//! [`Netns`] kills the processes still inside it (they can only be this run's: the namespace is
//! this run's) by PID and deletes itself; a [`NsProcess`] kills its process by PID. A run killed
//! outright (SIGKILL) cannot clean up; [`remove_stale`] deletes what dead runs left behind.
//!
//! Nothing here touches the host's own namespace beyond creating and deleting the named
//! namespaces: veth pairs are created inside the namespaces, never in the host's.

use std::fmt;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Where `ip netns` keeps its named namespaces.
const NETNS_DIR: &str = "/run/netns";

/// The prefix of every namespace this process creates: `mgy<pid>`.
pub fn run_prefix() -> String {
    format!("mgy{}", std::process::id())
}

/// A command that failed, with what it printed on stderr.
#[derive(Debug)]
pub struct CmdError {
    pub command: String,
    pub status: Option<ExitStatus>,
    pub stderr: String,
}

impl fmt::Display for CmdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            Some(s) => write!(f, "`{}` failed ({s}): {}", self.command, self.stderr.trim()),
            None => write!(
                f,
                "`{}` could not start: {}",
                self.command,
                self.stderr.trim()
            ),
        }
    }
}

impl std::error::Error for CmdError {}

/// Runs a command to its end; stdout on success, a [`CmdError`] naming it otherwise.
pub fn run(cmd: &mut Command) -> Result<String, CmdError> {
    let command = describe(cmd);
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| CmdError {
        command: command.clone(),
        status: None,
        stderr: e.to_string(),
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(CmdError {
            command,
            status: Some(out.status),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// One named network namespace of this run, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `mgy<pid>-<short>` with its loopback up. `short` should be short: interface and
    /// namespace names show up in error messages, and tests read better with `a`, `node`, `pod1`.
    pub fn new(short: &str) -> Result<Netns, CmdError> {
        let name = format!("{}-{short}", run_prefix());
        run(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The full name, as `ip netns` knows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind-mounted namespace file (`/run/netns/<name>`).
    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.name)
    }

    /// `ip -n <name> <args>`; its stdout.
    pub fn ip(&self, args: &[&str]) -> Result<String, CmdError> {
        run(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// A command that runs `program` inside the namespace (through `ip netns exec`, which also
    /// mounts a /sys of the namespace). Add arguments and run or spawn it.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Runs `program args` inside the namespace to its end; its stdout.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String, CmdError> {
        run(self.command(program).args(args))
    }

    /// Runs a shell script inside the namespace; its stdout.
    pub fn sh(&self, script: &str) -> Result<String, CmdError> {
        self.exec("sh", &["-c", script])
    }

    /// Starts `cmd` (made with [`Netns::command`]) in the background; killed by PID on drop.
    /// `ip netns exec` execs the program, so the PID is the program's own.
    pub fn spawn(&self, cmd: &mut Command) -> std::io::Result<NsProcess> {
        let child = cmd.stdin(Stdio::null()).spawn()?;
        Ok(NsProcess { child })
    }

    /// Moves the calling thread into the namespace until the guard is dropped. Sockets opened
    /// meanwhile belong to the namespace for their whole life.
    pub fn enter(&self) -> std::io::Result<NetnsGuard> {
        let back = File::open("/proc/thread-self/ns/net")?;
        let target = File::open(self.path())?;
        // SAFETY: setns on a valid namespace fd only changes this thread's namespace.
        if unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(NetnsGuard {
            back,
            _not_send: std::marker::PhantomData,
        })
    }

    /// Runs `f` on a fresh thread inside the namespace and returns its result. A panic in `f`
    /// is passed on to the caller.
    pub fn run_in<R: Send>(&self, f: impl FnOnce() -> R + Send) -> std::io::Result<R> {
        std::thread::scope(|s| {
            let handle = s.spawn(|| {
                let _guard = self.enter()?;
                Ok(f())
            });
            match handle.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// PIDs of the processes inside the namespace.
    pub fn pids(&self) -> Vec<i32> {
        run(Command::new("ip").args(["netns", "pids", &self.name]))
            .map(|s| {
                s.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Every process in here was started by this run (the namespace is this run's); kill
        // them by PID so none keeps the namespace alive after its name is gone.
        for pid in self.pids() {
            // SAFETY: plain kill(2) on a PID we just read from this namespace.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while !self.pids().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = run(Command::new("ip").args(["netns", "del", &self.name]));
    }
}

/// The calling thread is inside another namespace until this is dropped.
pub struct NetnsGuard {
    back: File,
    // setns is per thread: the guard must be dropped on the thread that entered.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        // SAFETY: returning this thread to the namespace it came from.
        unsafe { libc::setns(self.back.as_raw_fd(), libc::CLONE_NEWNET) };
    }
}

/// A process started inside a namespace, killed by PID when dropped.
#[derive(Debug)]
pub struct NsProcess {
    pub child: Child,
}

impl NsProcess {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `signal` and waits up to `timeout` for the process to end.
    pub fn signal_and_wait(&mut self, signal: i32, timeout: Duration) -> Option<ExitStatus> {
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(self.pid(), signal) };
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the process has ended (and how).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for NsProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A veth pair between two namespaces (or within one), both ends up. Deleting one end deletes
/// both, so dropping the pair removes it; deleting a namespace removes its end too.
#[derive(Debug)]
pub struct VethPair {
    ns_a: String,
    pub a: String,
    pub b: String,
}

impl VethPair {
    /// Creates `a` in `ns_a` and its peer `b` in `ns_b` (names up to 15 characters), both up.
    pub fn new(ns_a: &Netns, a: &str, ns_b: &Netns, b: &str) -> Result<VethPair, CmdError> {
        ns_a.ip(&[
            "link",
            "add",
            a,
            "type",
            "veth",
            "peer",
            "name",
            b,
            "netns",
            ns_b.name(),
        ])?;
        let pair = VethPair {
            ns_a: ns_a.name().to_owned(),
            a: a.to_owned(),
            b: b.to_owned(),
        };
        ns_a.ip(&["link", "set", a, "up"])?;
        ns_b.ip(&["link", "set", b, "up"])?;
        Ok(pair)
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        // Quietly: the namespace may be gone already, and the pair with it.
        let _ = Command::new("ip")
            .args(["-n", &self.ns_a, "link", "del", &self.a])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Deletes the namespaces of earlier runs (`mgy<pid>-*`) whose process is gone: what a run
/// killed with SIGKILL left behind. Returns how many it deleted. Processes are not killed.
pub fn remove_stale() -> usize {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("mgy")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if run(Command::new("ip").args(["netns", "del", &name])).is_ok() {
            removed += 1;
        }
    }
    removed
}
