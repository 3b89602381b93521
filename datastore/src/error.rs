//! Errors of typed access to resources: each says what is wrong and, where it helps, what to
//! do. (`StoreError` is the backend's; this wraps it with what the resources add.)

use crate::contract::StoreError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// A field is wrong; nothing was written.
    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// Something needed is in use, e.g. a pool with allocated blocks.
    #[error("{0}")]
    InUse(String),
    /// A compare-and-swap kept losing to other writers; nothing half-done remains.
    #[error("gave up after {attempts} attempts: the datastore kept changing under {what}; retry")]
    Contention { what: String, attempts: u32 },
    /// The caller's version is not the stored one.
    #[error("{0} was changed since it was read; read it again and retry")]
    Stale(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// A stored value that this margay cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("a stored {kind} is not valid: {reason}")]
    Malformed { kind: &'static str, reason: String },
    #[error(
        "a stored {kind} has schema {found}, this margay knows schema {known}; upgrade margay on this node"
    )]
    Schema {
        kind: &'static str,
        found: u32,
        known: u32,
    },
}
