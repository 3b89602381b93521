//! IPAM's errors: each says what is wrong and, where it helps, what to do.

use datastore::ResourceError;
use datastore::StoreError;
use datastore::resource::DecodeError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    /// A request field is wrong; nothing was written.
    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// Something needed is in use, e.g. a pool with allocated blocks.
    #[error("{0}")]
    InUse(String),
    /// No free address or block could be found.
    #[error("{0}")]
    Exhausted(String),
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

/// The resource layer's errors are IPAM's of the same name.
impl From<ResourceError> for IpamError {
    fn from(e: ResourceError) -> Self {
        match e {
            ResourceError::InvalidArgument { field, reason } => {
                IpamError::InvalidArgument { field, reason }
            }
            ResourceError::NotFound(s) => IpamError::NotFound(s),
            ResourceError::AlreadyExists(s) => IpamError::AlreadyExists(s),
            ResourceError::InUse(s) => IpamError::InUse(s),
            ResourceError::Contention { what, attempts } => {
                IpamError::Contention { what, attempts }
            }
            ResourceError::Stale(s) => IpamError::Stale(s),
            ResourceError::Store(e) => IpamError::Store(e),
            ResourceError::Decode(e) => IpamError::Decode(e),
        }
    }
}
