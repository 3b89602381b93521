//! margay's lab: network namespaces, real BGP peers (BIRD, FRR, GoBGP), etcd and the reference
//! CNI plugins, for end-to-end and interop tests and side-by-side benchmarks.
//!
//! Empty so far: the speaker, CNI and end-to-end issues fill it in.
