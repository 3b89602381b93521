//! The host side of a workload's veth, named as Calico names it: the CNI plugin creates the
//! interface under this name, and the Kubernetes datastore derives a Pod's endpoint with it,
//! so both agree on it without storing it anywhere.

/// The host-side interface of a workload: `prefix` followed by the first hex digits of SHA-1
/// of `<namespace>.<pod>` (Kubernetes), or of the container id when there is no pod name, so
/// that the name fills the kernel's 15 bytes (`cali` + 11 digits).
///
/// Calico names non-Kubernetes workloads `cali` + the first 11 characters of the container id;
/// hashing it instead keeps ids that share a prefix (common in tests and in some runtimes) from
/// colliding.
pub fn host_ifname(prefix: &str, workload_key: Option<&str>, container_id: &str) -> String {
    let key = workload_key.unwrap_or(container_id);
    let digits = 15usize.saturating_sub(prefix.len());
    let mut name = String::with_capacity(15);
    name.push_str(prefix);
    for byte in sha1_smol::Sha1::from(key.as_bytes()).digest().bytes() {
        name.push_str(&format!("{byte:02x}"));
    }
    name.truncate(prefix.len() + digits);
    name
}

/// The host-side interface of Kubernetes pod `pod` in `namespace` under Calico's prefix.
pub fn pod_ifname(namespace: &str, pod: &str) -> String {
    host_ifname("cali", Some(&format!("{namespace}.{pod}")), "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calico_names() {
        // SHA-1 of "abc" (FIPS 180-4's example) is a9993e36470681…
        assert_eq!(host_ifname("cali", Some("abc"), "x"), "calia9993e36470");
        assert_eq!(host_ifname("cali", None, "abc"), "calia9993e36470");
        assert_ne!(
            host_ifname("cali", None, "abc123"),
            host_ifname("cali", None, "abc124")
        );
        // Other prefixes still fill 15 bytes.
        assert_eq!(host_ifname("mgy", None, "x").len(), 15);
        assert_eq!(host_ifname("averylongpre", None, "x").len(), 15);
        assert_eq!(
            pod_ifname("default", "web-0"),
            host_ifname("cali", Some("default.web-0"), "ignored")
        );
    }
}
