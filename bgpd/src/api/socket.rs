//! The API's unix socket: created with mode 0600, a stale socket left by a crashed daemon is
//! replaced, a socket with a live daemon behind it is refused. The returned guard removes the
//! socket when bgpd stops, but only if it is still the one this process created.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use super::ApiError;

/// Removes the socket file on drop, unless another process has replaced it since.
#[derive(Debug)]
pub struct SocketGuard {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketGuard {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if m.dev() == self.dev && m.ino() == self.ino => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!(path = %self.path.display(), error = %e, "could not remove the API socket");
                }
            }
            _ => {}
        }
    }
}

/// Binds the unix socket at `path`, replacing a stale one.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketGuard), ApiError> {
    let bind_err = |source: io::Error| ApiError::SocketBind {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(bind_err)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(ApiError::NotASocket(path.to_owned()));
        }
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(ApiError::AlreadyRunning(path.to_owned())),
            // Nobody listens: a crashed daemon left it behind.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                tracing::info!(path = %path.display(), "replacing a stale API socket");
                std::fs::remove_file(path).map_err(bind_err)?;
            }
            Err(e) => return Err(bind_err(e)),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(bind_err(e)),
    }

    // Create the socket with no group/other bits from the start, so there is no moment in
    // which another user could connect.
    // SAFETY: umask only swaps the process's file mode mask.
    let old_mask = unsafe { libc::umask(0o177) };
    let listener = UnixListener::bind(path);
    unsafe { libc::umask(old_mask) };
    let listener = listener.map_err(bind_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(bind_err)?;
    let meta = std::fs::symlink_metadata(path).map_err(bind_err)?;
    Ok((
        listener,
        SocketGuard {
            path: path.to_owned(),
            dev: meta.dev(),
            ino: meta.ino(),
        },
    ))
}
