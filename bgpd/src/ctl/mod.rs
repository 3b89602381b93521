//! The client side of the API, used by bgpctl and by tests: connecting over the unix socket,
//! turning transport and status errors into one line an operator can act on, and rendering
//! answers as small tables or JSON.

pub mod bgp;
pub mod ipam;
pub mod pool;
pub mod routewriter;
pub mod status;
pub mod table;

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error(
        "cannot reach bgpd at {path}: {reason} (is bgpd running? --socket or MARGAY_API__SOCKET name another socket)"
    )]
    Unreachable { path: PathBuf, reason: String },
    #[error("{message} ({code:?})")]
    Status { code: tonic::Code, message: String },
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
    #[error("{0} inconsistencies found")]
    Inconsistent(usize),
    #[error("{0}")]
    Routewriter(String),
}

/// Where a command writes its answer: text for people or one JSON document.
pub struct Output {
    out: Box<dyn std::io::Write>,
}

impl Output {
    pub fn stdout() -> Self {
        Self {
            out: Box::new(std::io::stdout().lock()),
        }
    }

    pub fn to_writer(out: Box<dyn std::io::Write>) -> Self {
        Self { out }
    }

    pub fn text(&mut self, text: &str) -> Result<(), CtlError> {
        self.out.write_all(text.as_bytes())?;
        Ok(())
    }

    pub fn line(&mut self, line: &str) -> Result<(), CtlError> {
        writeln!(self.out, "{line}")?;
        Ok(())
    }

    pub fn json(&mut self, value: &serde_json::Value) -> Result<(), CtlError> {
        writeln!(self.out, "{value}")?;
        Ok(())
    }
}

impl From<tonic::Status> for CtlError {
    fn from(s: tonic::Status) -> Self {
        CtlError::Status {
            code: s.code(),
            message: s.message().to_owned(),
        }
    }
}

/// Connects to bgpd's unix socket. Fails at once, with the reason, if nobody listens there.
pub async fn connect_unix(path: &Path) -> Result<Channel, CtlError> {
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
        .map_err(|e| CtlError::Unreachable {
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
