//! margay's gRPC contract, version 1: the `.proto` files under `margay/v1` and the tonic/prost
//! code generated from them. Everything that crosses a process boundary between bgpd, bgpctl,
//! routewriter and the CNI plugins is defined here. Beside the generated code, only what every
//! side of the contract must agree on: how a client reaches bgpd's socket (`client`) and how a
//! node's VTEP MAC is derived and written (`mac`).

pub mod client;
pub mod mac;

// The code tonic and prost generate from the `.proto` files (`include_proto!`): its functions
// are as long as the generator makes them, and nobody edits them.
#[allow(clippy::too_many_lines)]
pub mod v1 {
    tonic::include_proto!("margay.v1");

    /// The encoded file descriptor set of the contract, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("margay_descriptor");

    /// Fully qualified names of every service in the contract.
    pub const SERVICE_NAMES: &[&str] = &[
        "margay.v1.Daemon",
        "margay.v1.Pools",
        "margay.v1.Nodes",
        "margay.v1.Ipam",
        "margay.v1.Bgp",
        "margay.v1.Dataplane",
        "margay.v1.Policy",
    ];
}
