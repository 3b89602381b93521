//! Which of a node's addresses leaked, on the Kubernetes datastore, as Calico's
//! kube-controllers decide it (sans-IO: what the node holds and what the apiserver said of
//! its pods in, the handles to release out):
//!
//! - an address recorded for a pod's primary interface (its `namespace` and `pod` attributes,
//!   `ifname` eth0 or none) leaked when that Pod is gone, is another Pod of that name (its
//!   `pod_uid` differs), runs on another node, has finished, or has addresses none of which
//!   it is; a Pod that exists without addresses yet (its ADD in progress) holds it. A second
//!   network's addresses (Multus' net1, ...) are not in the Pod's status and never judged;
//! - a handle is released whole or not at all: every address under it leaked;
//! - only once it has been seen leaking in every pass for the grace period (Calico's
//!   `leakGracePeriod`, 15 minutes by default), so a pod between its ADD and its Pod's update,
//!   or a short-lived view of the apiserver, loses nothing.
//!
//! Tunnel addresses and addresses without pod attributes are never leaks here. A pass whose
//! view of the pods is incomplete (the apiserver could not be asked) must not be made at all:
//! the caller skips it, and the tracker keeps what it saw.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

/// What the apiserver said of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodSeen {
    /// No such Pod.
    Gone,
    /// The Pod (its `uid`), on `node`, finished or not, with its addresses (empty: none yet).
    Exists {
        uid: String,
        node: String,
        finished: bool,
        addresses: Vec<IpAddr>,
    },
}

/// One address the node holds for a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAddress {
    pub handle: String,
    pub address: IpAddr,
    pub namespace: String,
    pub pod: String,
    /// The Pod's uid when the runtime gave it (`K8S_POD_UID`).
    pub pod_uid: Option<String>,
}

/// The handles seen leaking, and since when (seconds, the caller's clock).
#[derive(Debug, Default)]
pub struct LeakTracker {
    since: HashMap<String, u64>,
}

impl LeakTracker {
    /// One complete pass at `now`: `held` the node `node`'s pod addresses, `seen` what the
    /// apiserver said of each of their pods (by namespace and name). Returns the handles that
    /// have leaked for `grace` seconds or more, to release (after checking them once more).
    pub fn pass(
        &mut self,
        now: u64,
        grace: u64,
        node: &str,
        held: &[PodAddress],
        seen: &BTreeMap<(String, String), PodSeen>,
    ) -> Vec<String> {
        let mut by_handle: BTreeMap<&str, bool> = BTreeMap::new();
        for a in held {
            let leaked = leaked(node, a, seen.get(&(a.namespace.clone(), a.pod.clone())));
            let all = by_handle.entry(a.handle.as_str()).or_insert(true);
            *all &= leaked;
        }
        self.since
            .retain(|h, _| by_handle.get(h.as_str()).copied().unwrap_or(false));
        let mut due = Vec::new();
        for (handle, leaked) in by_handle {
            if !leaked {
                continue;
            }
            let since = *self.since.entry(handle.to_owned()).or_insert(now);
            if now.saturating_sub(since) >= grace {
                due.push(handle.to_owned());
            }
        }
        due
    }

    /// Forgets a handle (released, or found live on the last check).
    pub fn forget(&mut self, handle: &str) {
        self.since.remove(handle);
    }

    /// How many handles are being watched as leaks.
    pub fn watched(&self) -> usize {
        self.since.len()
    }
}

/// Whether `a` of `node` leaked, given what was said of its pod (`None`: not asked, which
/// counts as live).
pub fn leaked(node: &str, a: &PodAddress, seen: Option<&PodSeen>) -> bool {
    match seen {
        None => false,
        Some(PodSeen::Gone) => true,
        Some(PodSeen::Exists {
            uid,
            node: on,
            finished,
            addresses,
        }) => {
            a.pod_uid.as_ref().is_some_and(|u| u != uid)
                || on != node
                || *finished
                || (!addresses.is_empty() && !addresses.contains(&a.address))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(handle: &str, address: &str, pod: &str) -> PodAddress {
        PodAddress {
            handle: handle.into(),
            address: address.parse().unwrap(),
            namespace: "prod".into(),
            pod: pod.into(),
            pod_uid: Some("u1".into()),
        }
    }

    fn exists(node: &str, addresses: &[&str]) -> PodSeen {
        PodSeen::Exists {
            uid: "u1".into(),
            node: node.into(),
            finished: false,
            addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    fn seen(pairs: &[(&str, PodSeen)]) -> BTreeMap<(String, String), PodSeen> {
        pairs
            .iter()
            .map(|(p, s)| (("prod".to_owned(), (*p).to_owned()), s.clone()))
            .collect()
    }

    #[test]
    fn what_leaks() {
        let a = held("h", "10.0.0.5", "web");
        assert!(leaked("n1", &a, Some(&PodSeen::Gone)));
        assert!(
            leaked("n1", &a, Some(&exists("n2", &["10.0.0.5"]))),
            "elsewhere"
        );
        assert!(
            leaked("n1", &a, Some(&exists("n1", &["10.0.0.6"]))),
            "not its address"
        );
        let another = PodSeen::Exists {
            uid: "u2".into(),
            node: "n1".into(),
            finished: false,
            addresses: vec![],
        };
        assert!(leaked("n1", &a, Some(&another)), "another Pod of that name");
        let no_uid = PodAddress {
            pod_uid: None,
            ..a.clone()
        };
        assert!(
            !leaked("n1", &no_uid, Some(&another)),
            "no uid recorded: by name"
        );
        let finished = PodSeen::Exists {
            uid: "u1".into(),
            node: "n1".into(),
            finished: true,
            addresses: vec![],
        };
        assert!(leaked("n1", &a, Some(&finished)));
        assert!(!leaked("n1", &a, Some(&exists("n1", &["10.0.0.5"]))));
        assert!(
            !leaked("n1", &a, Some(&exists("n1", &[]))),
            "no address yet"
        );
        assert!(!leaked("n1", &a, None), "not asked");
    }

    #[test]
    fn a_handle_goes_whole_after_the_grace_period_of_leaking_in_every_pass() {
        let mut t = LeakTracker::default();
        let holding = [
            held("gone", "10.0.0.1", "ghost"),
            held("gone", "fd00::1", "ghost"),
            held("half", "10.0.0.2", "web"),
            held("half", "10.0.0.3", "web"),
            held("live", "10.0.0.4", "db"),
        ];
        let view = seen(&[
            ("ghost", PodSeen::Gone),
            ("web", exists("n1", &["10.0.0.2"])),
            ("db", exists("n1", &["10.0.0.4"])),
        ]);
        assert!(t.pass(100, 10, "n1", &holding, &view).is_empty());
        assert_eq!(t.watched(), 1, "half of a handle is no leak");
        assert!(t.pass(109, 10, "n1", &holding, &view).is_empty());
        assert_eq!(t.pass(110, 10, "n1", &holding, &view), ["gone"]);
        // Seen alive once: the count starts again.
        let back = seen(&[("ghost", exists("n1", &["10.0.0.1", "fd00::1"]))]);
        assert!(t.pass(111, 10, "n1", &holding, &back).is_empty());
        assert_eq!(t.watched(), 0);
        assert!(t.pass(112, 10, "n1", &holding, &view).is_empty());
        assert!(t.pass(121, 10, "n1", &holding, &view).is_empty());
        assert_eq!(t.pass(122, 10, "n1", &holding, &view), ["gone"]);
        t.forget("gone");
        assert_eq!(t.watched(), 0);
    }
}
