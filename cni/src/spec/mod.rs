//! The CNI protocol, sans IO: the environment (`env`), the network configuration (`config`),
//! results in every supported layout (`result`), error objects and codes (`error`), and
//! versions (`version`). Nothing here touches the kernel, a socket or the process environment,
//! so all of it is unit-tested exhaustively.

pub mod config;
pub mod env;
pub mod error;
pub mod oracle;
pub mod result;
pub mod version;

pub use config::NetConf;
pub use env::{Command, Env};
pub use error::{CniError, code};
pub use result::CniResult;
pub use version::Version;
