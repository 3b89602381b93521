//! margay's CNI plugins: `margay` wires a pod to the host, `margay-ipam` hands out its addresses
//! from bgpd over the unix socket.
//!
//! Empty so far: the CNI issue fills it in.
