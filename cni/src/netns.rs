//! The container's network namespace: opening CNI_NETNS (and telling "gone" from "not a
//! namespace"), entering it for a while on the calling thread, and the CNI error code of each
//! way that fails ([`netns_error`]).
//!
//! The plugin does its namespace work on one thread (the runtime is current-thread), so
//! `setns` there is safe: nothing else runs on that thread while it is inside.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::spec::error::{CniError, code};

/// The magic number of nsfs, the file system namespace files live on.
const NSFS_MAGIC: i64 = 0x6e73_6673;

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("the container's network namespace {0} does not exist")]
    Gone(PathBuf),
    #[error("CNI_NETNS {0} is not a network namespace")]
    NotNetns(PathBuf),
    #[error("CNI_NETNS {0} is the plugin's own network namespace, not a container's")]
    Ours(PathBuf),
    #[error("cannot open the network namespace {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot enter the network namespace {path}: {source}")]
    Enter { path: PathBuf, source: io::Error },
}

/// The CNI error for a namespace that cannot be opened or entered.
pub fn netns_error(e: &NetnsError) -> CniError {
    let code = match e {
        NetnsError::Gone(_) => code::UNKNOWN_CONTAINER,
        NetnsError::NotNetns(_) | NetnsError::Ours(_) => code::INVALID_ENVIRONMENT,
        NetnsError::Open { .. } | NetnsError::Enter { .. } => code::IO,
    };
    CniError::new(code, e.to_string())
}

/// An open network namespace file.
pub struct Netns {
    file: File,
    path: PathBuf,
}

impl Netns {
    /// Opens `path` and checks that it is a network namespace other than the caller's.
    pub fn open(path: &Path) -> Result<Netns, NetnsError> {
        let file = File::open(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => NetnsError::Gone(path.to_owned()),
            _ => NetnsError::Open {
                path: path.to_owned(),
                source: e,
            },
        })?;
        // SAFETY: fstatfs on an fd we own, into a zeroed struct.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
            return Err(NetnsError::Open {
                path: path.to_owned(),
                source: io::Error::last_os_error(),
            });
        }
        // A bind mount of /proc/<pid>/ns/net reports nsfs; a deleted namespace's leftover
        // mount point is a plain file on tmpfs.
        if st.f_type as i64 != NSFS_MAGIC {
            return Err(NetnsError::NotNetns(path.to_owned()));
        }
        let ns = Netns {
            file,
            path: path.to_owned(),
        };
        if ns.is_current()? {
            return Err(NetnsError::Ours(path.to_owned()));
        }
        Ok(ns)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    fn is_current(&self) -> Result<bool, NetnsError> {
        let err = |source| NetnsError::Open {
            path: self.path.clone(),
            source,
        };
        let mine = std::fs::metadata("/proc/thread-self/ns/net").map_err(err)?;
        let theirs = self.file.metadata().map_err(err)?;
        Ok(mine.dev() == theirs.dev() && mine.ino() == theirs.ino())
    }

    /// Moves the calling thread into the namespace until the guard is dropped.
    pub fn enter(&self) -> Result<Inside, NetnsError> {
        let err = |source| NetnsError::Enter {
            path: self.path.clone(),
            source,
        };
        let back = File::open("/proc/thread-self/ns/net").map_err(err)?;
        // SAFETY: setns on a namespace fd we hold changes only this thread's namespace.
        if unsafe { libc::setns(self.file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(err(io::Error::last_os_error()));
        }
        Ok(Inside {
            back,
            _not_send: std::marker::PhantomData,
        })
    }
}

/// The calling thread is inside a container's namespace until this is dropped.
pub struct Inside {
    back: File,
    // setns is per thread: the guard must be dropped on the thread that entered.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for Inside {
    fn drop(&mut self) {
        // SAFETY: returning this thread to the namespace it came from.
        let rc = unsafe { libc::setns(self.back.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            // Going on in the wrong namespace would change the container instead of the host.
            tracing::error!(
                "cannot return to the host network namespace: {}; aborting",
                io::Error::last_os_error()
            );
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_wrong_files() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("gone");
        assert!(matches!(Netns::open(&missing), Err(NetnsError::Gone(_))));
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"").unwrap();
        assert!(matches!(Netns::open(&plain), Err(NetnsError::NotNetns(_))));
    }

    #[test]
    fn our_own_namespace_is_refused() {
        let e = Netns::open(Path::new("/proc/self/ns/net")).err().unwrap();
        assert!(matches!(e, NetnsError::Ours(_)), "{e}");
    }

    #[test]
    fn namespace_errors_map_to_spec_codes() {
        assert_eq!(
            netns_error(&NetnsError::Gone("/x".into())).code,
            code::UNKNOWN_CONTAINER
        );
        assert_eq!(
            netns_error(&NetnsError::NotNetns("/x".into())).code,
            code::INVALID_ENVIRONMENT
        );
        assert_eq!(
            netns_error(&NetnsError::Ours("/x".into())).code,
            code::INVALID_ENVIRONMENT
        );
    }
}
