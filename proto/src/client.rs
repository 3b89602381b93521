//! What every client of bgpd's API shares (bgpctl, routewriter, the CNI plugins, tests):
//! where the socket is by default and how to connect to it, with an error an operator can
//! act on.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// bgpd's API socket unless the configuration names another.
pub const DEFAULT_SOCKET: &str = "/run/margay/bgpd.sock";

/// Nobody answers on the socket.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot reach bgpd at {path}: {reason} (is bgpd running? --socket or MARGAY_API__SOCKET name another socket)"
)]
pub struct Unreachable {
    pub path: PathBuf,
    pub reason: String,
}

/// Connects to bgpd's unix socket. Fails at once, with the reason, if nobody listens there.
pub async fn connect_unix(path: &Path) -> Result<Channel, Unreachable> {
    let socket = path.to_owned();
    // The URI is required by the API but unused: the connector below decides where to go.
    let endpoint = Endpoint::from_static("http://bgpd.invalid");
    endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| Unreachable {
            path: path.to_owned(),
            reason: error_chain(&e),
        })
}

/// The innermost messages of an error chain, joined: transport errors wrap the useful part.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut current = Some(err);
    while let Some(e) = current {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        current = e.source();
    }
    // The outer layers ("transport error") say little; keep the most specific last two.
    let keep = parts.len().saturating_sub(2);
    parts.split_off(keep).join(": ")
}
