//! margay's lab: real parts started by tests and benchmarks — etcd clusters on loopback so far;
//! network namespaces, BIRD, FRR, GoBGP and the reference CNI plugins as the issues land.
//!
//! - `lab`: starting and stopping the real parts, by PID, also on failure.
//! - `bench`: measuring helpers shared by the benchmark binaries.
//! - `conformance`: the datastore contract's conformance suite, run against every backend.

pub mod bench;
pub mod conformance;
pub mod lab;
