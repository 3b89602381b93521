//! `--store kubernetes`: bgpd's datastore is a real kube-apiserver (the one `scripts/build-kube`
//! builds) over etcd 3.7, both in the hub namespace, the apiserver on the hub's address; and
//! what the apiserver itself costs: its CPU and memory, its request rate and open watches,
//! read from its own `/metrics` (through kubectl of the same release, in the hub namespace).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use interop_tests::lab::kube_api;
use interop_tests::lab::mesh::{self, Mesh};
use interop_tests::lab::netns::NsProcess;
use interop_tests::lab::procstat;

use super::log_file;

const PORT: u16 = 6443;
const ETCD_CLIENT: &str = "http://127.0.0.1:12379";
const ETCD_PEER: &str = "http://127.0.0.1:12380";

/// etcd and the apiserver of one run.
pub struct KubeProcs {
    _etcd: NsProcess,
    apiserver: NsProcess,
    kubeconfig: PathBuf,
    hub: String,
}

/// The kubeconfig a run's nodes use (under the run's directory).
pub fn kubeconfig(dir: &Path) -> PathBuf {
    dir.join("kube").join("kubeconfig")
}

/// Starts etcd and the apiserver in the hub namespace and waits until it is ready.
pub fn start(mesh: &Mesh, dir: &Path) -> Result<KubeProcs, String> {
    let apiserver = kube_api::kube_dir().join("kube-apiserver");
    if !apiserver.exists() {
        return Err(format!(
            "{} is missing: run scripts/build-kube",
            apiserver.display()
        ));
    }
    let d = dir.join("kube");
    std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    let hub = mesh::HUB_ADDR.to_string();
    kube_api::write_pki(&d, &[&hub, "127.0.0.1"]);
    let config = kubeconfig(dir);
    std::fs::write(
        &config,
        kube_api::kubeconfig_text(&d, &format!("https://{hub}:{PORT}")),
    )
    .map_err(|e| e.to_string())?;
    let mut cmd = mesh.hub.command(kube_api::etcd_path());
    interop_tests::lab::etcd::member_args(
        &mut cmd,
        "kube",
        &d.join("etcd"),
        ETCD_CLIENT,
        ETCD_PEER,
    );
    cmd.stdout(Stdio::null())
        .stderr(log_file(&d.join("etcd.log"))?);
    let etcd = mesh
        .hub
        .spawn(&mut cmd)
        .map_err(|e| format!("starting etcd 3.7: {e}"))?;
    let mut cmd = mesh.hub.command(&apiserver);
    cmd.args(kube_api::apiserver_args(&d, ETCD_CLIENT, &hub, PORT))
        .stdout(Stdio::null())
        .stderr(log_file(&d.join("apiserver.log"))?);
    let apiserver = mesh
        .hub
        .spawn(&mut cmd)
        .map_err(|e| format!("starting kube-apiserver: {e}"))?;
    let procs = KubeProcs {
        _etcd: etcd,
        apiserver,
        kubeconfig: config,
        hub: mesh.hub.name().to_owned(),
    };
    let started = Instant::now();
    while procs.get("/readyz").is_none_or(|r| r.trim() != "ok") {
        if started.elapsed() > Duration::from_secs(90) {
            return Err(format!(
                "kube-apiserver not ready within 90 s (its log: {})",
                d.join("apiserver.log").display()
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(procs)
}

/// What the apiserver has done so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    pub at: Option<Instant>,
    /// `apiserver_request_total`, every verb and code.
    pub requests: f64,
    /// Open watches (`apiserver_longrunning_requests{verb="WATCH"}`).
    pub watches: f64,
    pub cpu_s: f64,
    pub rss_mib: f64,
}

impl KubeProcs {
    /// `kubectl get --raw PATH` in the hub namespace; `None` when it fails.
    fn get(&self, path: &str) -> Option<String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.hub])
            .arg(kube_api::kubectl_path())
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(["get", "--raw", path])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The apiserver's counters now.
    pub fn sample(&self) -> Sample {
        let metrics = self.get("/metrics").unwrap_or_default();
        let pid = self.apiserver.pid();
        Sample {
            at: Some(Instant::now()),
            requests: sum(&metrics, "apiserver_request_total{", |_| true),
            watches: sum(&metrics, "apiserver_longrunning_requests{", |l| {
                l.contains("verb=\"WATCH\"")
            }),
            cpu_s: procstat::cpu_seconds(pid),
            rss_mib: procstat::rss_mib(pid),
        }
    }
}

/// The sum of the samples of a metric (`prefix` is its name and `{`) whose line `keep`s.
fn sum(metrics: &str, prefix: &str, keep: impl Fn(&str) -> bool) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix) && keep(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Requests per second between two samples.
pub fn rate(from: &Sample, to: &Sample) -> f64 {
    match (from.at, to.at) {
        (Some(a), Some(b)) if b > a => (to.requests - from.requests) / (b - a).as_secs_f64(),
        _ => 0.0,
    }
}

/// One run's apiserver figures.
#[derive(Debug, Clone, Default)]
pub struct ApiserverRow {
    pub n: usize,
    pub idle_rps: f64,
    pub idle_watches: f64,
    pub burst_rps: f64,
    pub burst_watches: f64,
    pub burst_claims: usize,
    pub burst_s: f64,
    pub cpu_s: f64,
    pub rss_mib: f64,
}

pub fn print_table(out: &mut impl std::io::Write, rows: &[ApiserverRow]) -> std::io::Result<()> {
    writeln!(
        out,
        "# kube-apiserver under bgpd (--store kubernetes): requests/s and open watches idle \
         (10 s after the claims' run) and during a burst of claims back to back on one node \
         (then their releases); its CPU over the whole run and its RSS at the end"
    )?;
    writeln!(
        out,
        "{:>5}  {:>9} {:>8}  {:>6} {:>10} {:>8} {:>8}  {:>7} {:>8}",
        "N", "idle rq/s", "watches", "burst", "burst s", "rq/s", "watches", "CPU s", "RSS MiB"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:>5}  {:>9.1} {:>8.0}  {:>6} {:>10.2} {:>8.1} {:>8.0}  {:>7.1} {:>8.0}",
            r.n,
            r.idle_rps,
            r.idle_watches,
            r.burst_claims,
            r.burst_s,
            r.burst_rps,
            r.burst_watches,
            r.cpu_s,
            r.rss_mib
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_pick_their_lines() {
        let m = "# HELP x\napiserver_request_total{code=\"200\",verb=\"GET\"} 12\n\
                 apiserver_request_total{code=\"409\",verb=\"PUT\"} 3\n\
                 apiserver_longrunning_requests{resource=\"nodes\",verb=\"WATCH\"} 7\n\
                 apiserver_longrunning_requests{resource=\"pods\",verb=\"CONNECT\"} 1\n";
        assert_eq!(sum(m, "apiserver_request_total{", |_| true), 15.0);
        assert_eq!(
            sum(m, "apiserver_longrunning_requests{", |l| l
                .contains("verb=\"WATCH\"")),
            7.0
        );
    }
}
