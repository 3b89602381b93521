//! The sysctls Calico keeps: `net.ipv4.ip_forward` on, and on each workload (`cali*`)
//! interface proxy ARP (pods reach 169.254.1.1 through it), forwarding, route_localnet, no
//! proxy delay, and rp_filter as the host's default. A value is written only when it differs,
//! so a restart with nothing changed writes nothing.
//!
//! Paths are read in the network namespace of the process (what /proc/sys/net shows).

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("cannot set {path} to {value}: {source} (routewriter needs root and a writable /proc/sys)")]
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

    pub fn ensure_forwarding(&mut self) -> Result<bool, SysctlError> {
        self.ensure("net/ipv4/ip_forward", "1")
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
        std::fs::write(root.join("net/ipv4/ip_forward"), "0\n").unwrap();
        std::fs::write(root.join("net/ipv4/conf/default/rp_filter"), "2\n").unwrap();
        for k in ["route_localnet", "proxy_arp", "forwarding", "rp_filter"] {
            std::fs::write(root.join(format!("net/ipv4/conf/cali1/{k}")), "0\n").unwrap();
        }
        std::fs::write(root.join("net/ipv4/neigh/cali1/proxy_delay"), "80\n").unwrap();
        let mut s = Sysctls::new(root);
        assert!(s.ensure_forwarding().unwrap());
        assert!(!s.ensure_forwarding().unwrap());
        assert_eq!(s.ensure_workload("cali1").unwrap(), 5);
        assert_eq!(s.ensure_workload("cali1").unwrap(), 0);
        assert_eq!(s.writes, 6);
        assert_eq!(
            std::fs::read_to_string(root.join("net/ipv4/conf/cali1/rp_filter")).unwrap(),
            "2"
        );
        let e = s.ensure_workload("missing").unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }
}
