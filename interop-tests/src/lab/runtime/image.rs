//! A root file system and an OCI image made from Debian's busybox-static, for runtimes that
//! must not pull anything: the directory for `ctr run --rootfs`, a plain tarball for
//! `podman import`, and an OCI image layout archive for `ctr images import` (the CRI's sandbox
//! and container image). Digests come from `sha256sum`, archives from `tar`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use super::output;

/// Debian's busybox-static.
pub const BUSYBOX: &str = "/bin/busybox";

/// What [`build`] made.
#[derive(Debug, Clone)]
pub struct Busybox {
    /// The root file system (busybox and a link per applet).
    pub rootfs: PathBuf,
    /// `rootfs` as a tarball (one image layer; `podman import` takes it too).
    pub layer: PathBuf,
    /// An OCI image layout archive of the image named `name`.
    pub oci_archive: PathBuf,
    pub name: String,
}

/// Builds the root file system and both archives under `dir`. The image's entrypoint sleeps
/// (what a pod's sandbox, the "pause" container, does).
pub fn build(dir: &Path, name: &str) -> Result<Busybox, String> {
    let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    if !Path::new(BUSYBOX).exists() {
        return Err(format!(
            "{BUSYBOX} is missing: install Debian's busybox-static"
        ));
    }
    let rootfs = dir.join("rootfs");
    for sub in ["bin", "proc", "sys", "dev", "etc", "tmp", "www", "root"] {
        std::fs::create_dir_all(rootfs.join(sub)).map_err(|e| io(&rootfs, e))?;
    }
    let bb = rootfs.join("bin/busybox");
    std::fs::copy(BUSYBOX, &bb).map_err(|e| io(&bb, e))?;
    let applets = output(Command::new(BUSYBOX).arg("--list"))?;
    for applet in applets
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox")
    {
        let link = rootfs.join("bin").join(applet);
        if !link.exists() {
            std::os::unix::fs::symlink("busybox", &link).map_err(|e| io(&link, e))?;
        }
    }
    std::fs::write(rootfs.join("www/index.html"), "margay\n").map_err(|e| io(&rootfs, e))?;
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")
        .map_err(|e| io(&rootfs, e))?;
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\n").map_err(|e| io(&rootfs, e))?;

    let layer = dir.join("layer.tar");
    output(
        Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .args(["--numeric-owner", "-cf"])
            .arg(&layer)
            .arg("."),
    )?;

    // The OCI image layout: blobs by digest, a manifest, an index naming the image.
    let layout = dir.join("oci");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(|e| io(&blobs, e))?;
    let (layer_digest, layer_size) =
        add_blob(&blobs, &std::fs::read(&layer).map_err(|e| io(&layer, e))?)?;
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": ["/bin/sleep", "2147483647"],
            "Env": ["PATH=/bin"],
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
    });
    let (config_digest, config_size) = add_blob(&blobs, config.to_string().as_bytes())?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_digest}"),
            "size": config_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer_size,
        }],
    });
    let (manifest_digest, manifest_size) = add_blob(&blobs, manifest.to_string().as_bytes())?;
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest_size,
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": name.rsplit(':').next().unwrap_or("latest"),
            },
        }],
    });
    std::fs::write(layout.join("index.json"), index.to_string()).map_err(|e| io(&layout, e))?;
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .map_err(|e| io(&layout, e))?;
    let oci_archive = dir.join("image.oci.tar");
    output(
        Command::new("tar")
            .arg("-C")
            .arg(&layout)
            .arg("-cf")
            .arg(&oci_archive)
            .args(["oci-layout", "index.json", "blobs"]),
    )?;
    Ok(Busybox {
        rootfs,
        layer,
        oci_archive,
        name: name.to_owned(),
    })
}

/// Stores `bytes` as a blob; its hex digest and size.
fn add_blob(blobs: &Path, bytes: &[u8]) -> Result<(String, usize), String> {
    let tmp = blobs.join(".incoming");
    std::fs::write(&tmp, bytes).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let sum = output(Command::new("sha256sum").arg(&tmp))?;
    let digest = sum.split_whitespace().next().unwrap_or_default().to_owned();
    if digest.len() != 64 {
        return Err(format!("sha256sum printed {sum:?}"));
    }
    std::fs::rename(&tmp, blobs.join(&digest)).map_err(|e| e.to_string())?;
    Ok((digest, bytes.len()))
}
