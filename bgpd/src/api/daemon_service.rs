//! The `Daemon` service: who this bgpd is and what it is connected to.

use std::time::Instant;

use proto::v1::daemon_server::Daemon;
use proto::v1::{DaemonStatus, DatastoreState, GetStatusRequest};
use tonic::{Request, Response, Status};

use crate::datastore::{self, DatastoreHandle};

/// What the daemon knows about itself.
#[derive(Clone)]
pub struct DaemonInfo {
    pub node: String,
    pub datastore: DatastoreHandle,
    /// The node and the default pools are in the datastore (see [`crate::registration`]).
    pub registered: tokio::sync::watch::Receiver<bool>,
    pub started: Instant,
    /// The desired kernel state served to routewriter.
    pub dataplane: crate::dataplane::Hub,
    /// The BGP speaker task.
    pub bgp: crate::speaker::SpeakerHandle,
    /// The API's counters, read by the metrics listener: its calls, and what its caps
    /// hold and refused. (One field, so that the daemon creates both as it created the
    /// first: `Default::default()`.)
    pub api_stats: ApiCounters,
}

/// The API's counters: its calls by method and code (`crate::api_stats`), and its caps'
/// open and refused counts (`super::limits`).
#[derive(Debug, Clone, Default)]
pub struct ApiCounters {
    pub calls: crate::api_stats::ApiStats,
    pub limits: super::limits::LimitCounters,
}

#[derive(Clone)]
pub struct DaemonService {
    info: DaemonInfo,
}

impl DaemonService {
    pub fn new(info: DaemonInfo) -> Self {
        Self { info }
    }
}

#[tonic::async_trait]
impl Daemon for DaemonService {
    async fn get_status(
        &self,
        _request: Request<GetStatusRequest>,
    ) -> Result<Response<DaemonStatus>, Status> {
        let (state, error) = match self.info.datastore.state() {
            datastore::DatastoreState::Connected => (DatastoreState::Connected, String::new()),
            datastore::DatastoreState::Connecting => {
                (DatastoreState::Unavailable, "connecting".to_owned())
            }
            datastore::DatastoreState::Unavailable(why) => (DatastoreState::Unavailable, why),
        };
        Ok(Response::new(DaemonStatus {
            node: self.info.node.clone(),
            datastore: self.info.datastore.describe().to_owned(),
            datastore_state: state.into(),
            uptime_s: self.info.started.elapsed().as_secs(),
            version: crate::VERSION.to_owned(),
            datastore_error: error,
        }))
    }
}
