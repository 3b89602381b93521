//! `margay-cni-install`: puts the plugins where container runtimes look (`/opt/cni/bin`) and the
//! network configuration list where they read it (`/etc/cni/net.d`). Files are written beside
//! their target and renamed over it, so a runtime never runs a half-copied plugin or reads a
//! half-written conflist, and pods being wired while it runs keep the binary they started.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::spec::config::Encap;

/// The conflist shipped with margay (margay, then portmap and bandwidth for the runtime's
/// `portMappings` and `bandwidth` capabilities, as Calico's installer chains them), the
/// template the command fills in.
pub const CONFLIST_TEMPLATE: &str = include_str!("../../configs/10-margay.conflist");

/// The plugin binaries installed.
pub const BINARIES: &[&str] = &["margay", "margay-ipam"];

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} is not built next to margay-cni-install (build the cni crate, or pass --from)")]
    MissingBinary(PathBuf),
    #[error("the conflist template is broken: {0}")]
    Template(String),
    #[error(
        "{0} was not written by margay-cni-install; it is left as it is (remove it, pass --conf-name for another file, or --force to replace it)"
    )]
    NotOurs(PathBuf),
}

/// The top-level key by which a conflist says margay-cni-install wrote it (runtimes ignore
/// keys they do not know); only such a file is ever replaced.
pub const OWNER_KEY: &str = "margay";

/// Whether the conflist text is one margay-cni-install wrote.
pub fn written_by_us(text: &str) -> bool {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| {
            v.get(OWNER_KEY)?
                .get("writtenBy")?
                .as_str()
                .map(|w| w == "margay-cni-install")
        })
        .unwrap_or(false)
}

/// Whether a conflist may be written at `target`: it is absent, or ours, or `force`.
pub fn may_write(target: &Path, force: bool) -> Result<(), InstallError> {
    match std::fs::read_to_string(target) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(InstallError::Io {
            path: target.to_owned(),
            source,
        }),
        Ok(text) if force || written_by_us(&text) => Ok(()),
        Ok(_) => Err(InstallError::NotOurs(target.to_owned())),
    }
}

/// What the conflist says beyond the template's defaults.
#[derive(Debug, Clone, Default)]
pub struct ConfOptions {
    pub network_name: Option<String>,
    pub socket: Option<PathBuf>,
    pub mtu: Option<u32>,
    pub encapsulation: Option<Encap>,
    pub nodename: Option<String>,
    pub log_file: Option<PathBuf>,
    pub log_level: Option<String>,
    pub assign_ipv6: bool,
}

/// The conflist with `opts` applied to the margay plugin's entry (pure).
pub fn render_conflist(template: &str, opts: &ConfOptions) -> Result<String, InstallError> {
    let mut v: Value =
        serde_json::from_str(template).map_err(|e| InstallError::Template(e.to_string()))?;
    if let Some(name) = &opts.network_name {
        v["name"] = Value::from(name.as_str());
    }
    let plugins = v
        .get_mut("plugins")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| InstallError::Template("no plugins list".into()))?;
    let margay = plugins
        .iter_mut()
        .find(|p| p.get("type").and_then(Value::as_str) == Some("margay"))
        .ok_or_else(|| InstallError::Template("no margay plugin".into()))?;
    if let Some(s) = &opts.socket {
        margay["socket"] = Value::from(s.display().to_string());
    }
    if let Some(m) = opts.mtu {
        margay["mtu"] = Value::from(m);
    }
    if let Some(e) = opts.encapsulation {
        margay["encapsulation"] = Value::from(match e {
            Encap::Vxlan => "vxlan",
            Encap::Ipip => "ipip",
            Encap::None => "none",
        });
    }
    if let Some(n) = &opts.nodename {
        margay["nodename"] = Value::from(n.as_str());
    }
    if let Some(f) = &opts.log_file {
        margay["log_file_path"] = Value::from(f.display().to_string());
    }
    if let Some(l) = &opts.log_level {
        margay["log_level"] = Value::from(l.as_str());
    }
    if opts.assign_ipv6 {
        margay["ipam"]["assign_ipv6"] = Value::from("true");
    }
    let mut text =
        serde_json::to_string_pretty(&v).map_err(|e| InstallError::Template(e.to_string()))?;
    text.push('\n');
    Ok(text)
}

/// Writes `bytes` to `target` through a temporary file in the same directory, with `mode`.
pub fn write_atomically(target: &Path, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let io = |source| InstallError::Io {
        path: target.to_owned(),
        source,
    };
    let dir = target.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.margay-install-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        std::fs::rename(&tmp, target)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

/// Copies the plugin binaries from `from` into `bin_dir`; the paths written.
pub fn install_binaries(from: &Path, bin_dir: &Path) -> Result<Vec<PathBuf>, InstallError> {
    let mut written = Vec::new();
    for name in BINARIES {
        let src = from.join(name);
        let bytes = std::fs::read(&src).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => InstallError::MissingBinary(src.clone()),
            _ => InstallError::Io {
                path: src.clone(),
                source: e,
            },
        })?;
        let dst = bin_dir.join(name);
        write_atomically(&dst, &bytes, 0o755)?;
        written.push(dst);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_conflist_is_valid_for_margay() {
        let v: Value = serde_json::from_str(CONFLIST_TEMPLATE).unwrap();
        let plugins = v["plugins"].as_array().unwrap();
        assert_eq!(plugins[0]["type"], "margay");
        assert_eq!(plugins[1]["type"], "portmap");
        assert_eq!(plugins[1]["capabilities"]["portMappings"], true);
        assert_eq!(plugins[2]["type"], "bandwidth");
        assert_eq!(plugins[2]["capabilities"]["bandwidth"], true);
        assert!(written_by_us(CONFLIST_TEMPLATE));
        // The margay entry, as a runtime passes it, is a valid configuration.
        let mut conf = plugins[0].clone();
        conf["name"] = v["name"].clone();
        conf["cniVersion"] = v["cniVersion"].clone();
        let c = crate::spec::NetConf::parse(conf.to_string().as_bytes()).unwrap();
        assert!(c.ipam_is_ours());
        assert_eq!(c.mtu, None);
    }

    #[test]
    fn options_land_in_the_margay_entry() {
        let text = render_conflist(
            CONFLIST_TEMPLATE,
            &ConfOptions {
                network_name: Some("pods".into()),
                socket: Some("/run/x.sock".into()),
                mtu: Some(1400),
                encapsulation: Some(Encap::Ipip),
                nodename: Some("node-a".into()),
                log_file: Some("/tmp/cni.log".into()),
                log_level: Some("debug".into()),
                assign_ipv6: true,
            },
        )
        .unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["name"], "pods");
        let m = &v["plugins"][0];
        assert_eq!(m["socket"], "/run/x.sock");
        assert_eq!(m["mtu"], 1400);
        assert_eq!(m["encapsulation"], "ipip");
        assert_eq!(m["nodename"], "node-a");
        assert_eq!(m["log_level"], "debug");
        assert_eq!(m["ipam"]["assign_ipv6"], "true");
        assert_eq!(v["plugins"][1]["type"], "portmap");
        assert!(render_conflist("{}", &ConfOptions::default()).is_err());
        assert!(render_conflist("nope", &ConfOptions::default()).is_err());
    }

    #[test]
    fn only_our_own_conflist_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("10-margay.conflist");
        may_write(&target, false).unwrap();
        let ours = render_conflist(CONFLIST_TEMPLATE, &ConfOptions::default()).unwrap();
        std::fs::write(&target, &ours).unwrap();
        may_write(&target, false).unwrap();
        // A conflist someone else wrote, even one that chains margay, is left alone.
        let theirs = ours.replace("\"writtenBy\": \"margay-cni-install\"", "\"x\": 1");
        assert_ne!(theirs, ours);
        for text in [theirs.as_str(), "{\"name\": \"calico\"}", "not json"] {
            std::fs::write(&target, text).unwrap();
            let e = may_write(&target, false).unwrap_err();
            assert!(matches!(e, InstallError::NotOurs(_)), "{e}");
            assert!(e.to_string().contains("--force"), "{e}");
            may_write(&target, true).unwrap();
        }
    }

    #[test]
    fn installs_binaries_atomically() {
        use std::os::unix::fs::PermissionsExt;
        let from = tempfile::tempdir().unwrap();
        let to = tempfile::tempdir().unwrap();
        for b in BINARIES {
            std::fs::write(from.path().join(b), b"\x7fELF").unwrap();
        }
        let bin = to.path().join("opt/cni/bin");
        let written = install_binaries(from.path(), &bin).unwrap();
        assert_eq!(written.len(), 2);
        for p in &written {
            let mode = std::fs::metadata(p).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o755);
        }
        // Nothing temporary is left beside them.
        assert_eq!(std::fs::read_dir(&bin).unwrap().count(), 2);
        let e = install_binaries(to.path(), &bin).unwrap_err();
        assert!(matches!(e, InstallError::MissingBinary(_)), "{e}");
    }
}
