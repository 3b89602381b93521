//! `/proc/sys` values as margay keeps them: a value is written only when it differs, so a
//! restart with nothing changed writes nothing, and every write is counted. The settings of a
//! workload (`cali*`) interface's host end are Calico's, set by the CNI plugin on ADD and
//! kept by routewriter: proxy ARP (pods reach 169.254.1.1 through it), forwarding,
//! route_localnet, no proxy delay, rp_filter as the host's default; with IPv6, IPv6 on, no
//! DAD, proxy NDP and forwarding.
//!
//! Paths are read in the network namespace of the calling thread (what /proc/sys/net shows).

use std::path::{Path, PathBuf};

/// Host-wide forwarding of IPv4.
pub const FORWARDING_V4: &str = "net/ipv4/ip_forward";
/// Host-wide forwarding of IPv6.
pub const FORWARDING_V6: &str = "net/ipv6/conf/all/forwarding";

#[derive(Debug, thiserror::Error)]
#[error(
    "cannot set {path} to {value}: {source} (this needs root and /proc/sys mounted writable in this network namespace)"
)]
pub struct SysctlError {
    pub path: String,
    pub value: String,
    #[source]
    pub source: std::io::Error,
}

pub struct Sysctls {
    root: PathBuf,
    /// Values written.
    pub writes: u64,
}

impl Default for Sysctls {
    fn default() -> Self {
        Self::new(Path::new("/proc/sys"))
    }
}

impl Sysctls {
    /// Values under `root` (`/proc/sys`, or a directory standing in for it in tests).
    pub fn new(root: &Path) -> Self {
        Sysctls {
            root: root.to_owned(),
            writes: 0,
        }
    }

    /// Sets `rel` (e.g. "net/ipv4/ip_forward") to `value` unless it already is; true if written.
    pub fn ensure(&mut self, rel: &str, value: &str) -> Result<bool, SysctlError> {
        let path = self.root.join(rel);
        let err = |source| SysctlError {
            path: path.display().to_string(),
            value: value.to_owned(),
            source,
        };
        let current = std::fs::read_to_string(&path).map_err(err)?;
        if current.trim() == value {
            return Ok(false);
        }
        std::fs::write(&path, value).map_err(err)?;
        self.writes += 1;
        Ok(true)
    }

    /// The per-interface settings of a workload interface; how many were written.
    pub fn ensure_workload(&mut self, ifname: &str) -> Result<usize, SysctlError> {
        // Felix's rp_filter: the host default, 1 when unreadable.
        let rp = std::fs::read_to_string(self.root.join("net/ipv4/conf/default/rp_filter"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "1".into());
        let conf = format!("net/ipv4/conf/{ifname}");
        let mut n = 0;
        for (key, value) in [
            (format!("{conf}/route_localnet"), "1"),
            (format!("{conf}/proxy_arp"), "1"),
            (format!("{conf}/forwarding"), "1"),
            (format!("{conf}/rp_filter"), rp.as_str()),
            (format!("net/ipv4/neigh/{ifname}/proxy_delay"), "0"),
        ] {
            n += usize::from(self.ensure(&key, value)?);
        }
        Ok(n)
    }

    /// The IPv6 settings of a workload interface that carries IPv6; how many were written.
    pub fn ensure_workload_v6(&mut self, ifname: &str) -> Result<usize, SysctlError> {
        let conf = format!("net/ipv6/conf/{ifname}");
        let mut n = 0;
        for (key, value) in Self::WORKLOAD_V6 {
            n += usize::from(self.ensure(&format!("{conf}/{key}"), value)?);
        }
        Ok(n)
    }

    /// The per-interface IPv6 settings of a workload's host side (Felix's): IPv6 on, no DAD
    /// (the pod's address is unique by IPAM), proxy NDP (the pod's gateway is answered for)
    /// and forwarding.
    pub const WORKLOAD_V6: [(&'static str, &'static str); 4] = [
        ("disable_ipv6", "0"),
        ("accept_dad", "0"),
        ("proxy_ndp", "1"),
        ("forwarding", "1"),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_only_what_differs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("net/ipv4/conf/cali1")).unwrap();
        std::fs::create_dir_all(root.join("net/ipv4/conf/default")).unwrap();
        std::fs::create_dir_all(root.join("net/ipv4/neigh/cali1")).unwrap();
        std::fs::write(root.join(FORWARDING_V4), "0\n").unwrap();
        std::fs::write(root.join("net/ipv4/conf/default/rp_filter"), "2\n").unwrap();
        for k in ["route_localnet", "proxy_arp", "forwarding", "rp_filter"] {
            std::fs::write(root.join(format!("net/ipv4/conf/cali1/{k}")), "0\n").unwrap();
        }
        std::fs::write(root.join("net/ipv4/neigh/cali1/proxy_delay"), "80\n").unwrap();
        std::fs::create_dir_all(root.join("net/ipv6/conf/all")).unwrap();
        std::fs::create_dir_all(root.join("net/ipv6/conf/cali1")).unwrap();
        std::fs::write(root.join(FORWARDING_V6), "0\n").unwrap();
        for (k, v) in [
            ("disable_ipv6", "1"),
            ("accept_dad", "1"),
            ("proxy_ndp", "1"),
            ("forwarding", "0"),
        ] {
            std::fs::write(root.join(format!("net/ipv6/conf/cali1/{k}")), v).unwrap();
        }
        let mut s = Sysctls::new(root);
        assert!(s.ensure(FORWARDING_V4, "1").unwrap());
        assert!(!s.ensure(FORWARDING_V4, "1").unwrap());
        assert!(s.ensure(FORWARDING_V6, "1").unwrap());
        assert!(!s.ensure(FORWARDING_V6, "1").unwrap());
        assert_eq!(
            std::fs::read_to_string(root.join(FORWARDING_V6)).unwrap(),
            "1"
        );
        assert_eq!(s.ensure_workload("cali1").unwrap(), 5);
        assert_eq!(s.ensure_workload("cali1").unwrap(), 0);
        // proxy_ndp was right already: three of four.
        assert_eq!(s.ensure_workload_v6("cali1").unwrap(), 3);
        assert_eq!(s.ensure_workload_v6("cali1").unwrap(), 0);
        assert_eq!(s.writes, 10);
        assert_eq!(
            std::fs::read_to_string(root.join("net/ipv4/conf/cali1/rp_filter")).unwrap(),
            "2"
        );
        let e = s.ensure_workload("missing").unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        assert!(e.to_string().contains("needs root"), "{e}");
        assert_eq!(e.source.kind(), std::io::ErrorKind::NotFound);
    }
}
