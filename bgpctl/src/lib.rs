//! bgpctl, the operator's CLI: a client of bgpd's gRPC API (and of routewriter's status
//! listener), nothing more. Turns transport and status errors into one line an operator can
//! act on, and renders answers as small tables or JSON. Connecting is `proto::client`'s.

pub mod bgp;
pub mod ipam;
pub mod pool;
pub mod resources;
pub mod service;
pub mod status;
pub mod table;

pub use proto::client::{connect_unix, error_chain};

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error(transparent)]
    Unreachable(#[from] proto::client::Unreachable),
    #[error("{message} ({code:?})")]
    Status { code: tonic::Code, message: String },
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
    #[error("{0} inconsistencies found")]
    Inconsistent(usize),
    #[error(transparent)]
    Routewriter(#[from] daemon_common::observe::status::StatusError),
    /// A command line bgpctl refuses before asking bgpd.
    #[error("{0}")]
    Invalid(String),
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
