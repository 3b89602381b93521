//! `runtime-bench`: N pod sandboxes started at once through containerd's CRI, as a kubelet
//! starts them, on margay (the chain `margay-cni-install` writes: margay, portmap, bandwidth)
//! and on the reference chain (ptp + host-local, then the same portmap and bandwidth), each on
//! its own lab node under its own containerd, the reference first, then margay, in one run.
//! Prints RunPodSandbox p50 / p99 for both and their ratio, margay's own ADD time from its log
//! (the share of the CNI plugin in a sandbox's start), and checks that every sandbox got its
//! own address and that nothing is left allocated after the runtime's teardown.
//!
//! `runtime-bench [--pods N] [--smoke]`; needs root, Debian's containerd, runc,
//! containernetworking-plugins and busybox-static; it brings up a lab of its own.

use std::path::Path;
use std::time::{Duration, Instant};

use clap::Parser;
use interop_tests::bench::{ms, percentile};
use interop_tests::lab::local::LocalLab;
use interop_tests::lab::runtime::containerd::{CRI_NAMESPACE, Containerd};
use interop_tests::lab::runtime::cri::PodSpec;
use interop_tests::lab::runtime::{self, CniDirs, image};

const NETWORK: &str = "containerd-pods";
const IMAGE: &str = "docker.io/margay/busybox:1";

#[derive(Parser)]
#[command(
    about = "N pod sandboxes at once through containerd's CRI: margay against ptp + host-local"
)]
struct Args {
    /// Sandboxes started at once.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// A quick run that checks the benchmark works (10 sandboxes).
    #[arg(long)]
    smoke: bool,
}

/// RunPodSandbox for `n` pods at once on `c`; their durations. Every sandbox must have an
/// address of its own; all are stopped and removed after (the runtime's DEL).
fn run_batch(c: &Containerd, n: usize, label: &str) -> Result<Vec<Duration>, String> {
    let mut cri = c.cri()?;
    let pods: Vec<PodSpec> = (0..n)
        .map(|i| PodSpec::new("load", &format!("{label}-{i}")))
        .collect();
    let t = Instant::now();
    let results = cri.run_sandboxes(&pods);
    let wall = t.elapsed();
    let mut times = Vec::new();
    let mut ids = Vec::new();
    let mut ips = std::collections::BTreeSet::new();
    for (r, d) in results {
        let id = r.map_err(|e| format!("{label}: {e}\ncontainerd: {}", c.log_tail()))?;
        let (ip, _) = cri.sandbox_ip(&id)?;
        if ip.is_empty() {
            return Err(format!("{label}: sandbox {id} has no address"));
        }
        ips.insert(ip);
        times.push(d);
        ids.push(id);
    }
    if ips.len() != n {
        return Err(format!(
            "{label}: {n} sandboxes, {} distinct addresses",
            ips.len()
        ));
    }
    println!("{label:<16} {n} sandboxes at once, all up in {}", ms(wall));
    for id in &ids {
        cri.stop_sandbox(id)?;
        cri.remove_sandbox(id)?;
    }
    Ok(times)
}

/// margay's own ADD times from its log (`elapsed_ms` of "ADD wired the pod").
fn logged_adds(log: &Path) -> Vec<Duration> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("ADD wired the pod"))
        .filter_map(|l| {
            let rest = &l[l.find("elapsed_ms")? + "elapsed_ms".len()..];
            let rest = rest.trim_start_matches(['"', ':', '=', ' ']);
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            rest[..end].parse::<f64>().ok()
        })
        .map(|ms| Duration::from_secs_f64(ms / 1e3))
        .collect()
}

fn run(args: &Args) -> Result<(), String> {
    let n = if args.smoke { 10 } else { args.pods };
    let lab = LocalLab::new(&format!("mrb{}", std::process::id()));
    let (ok, text) = lab.run(&["up"]);
    if !ok {
        return Err(format!("margay-lab up: {text}"));
    }
    let root = tempfile::tempdir().map_err(|e| e.to_string())?;
    let img = image::build(&root.path().join("image"), IMAGE)?;
    let cni = runtime::install_on(&lab, root.path(), "node-1", NETWORK)?;
    let reference = CniDirs::reference_only(
        &root.path().join("cni-ref"),
        &serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "ptp-ref",
            "plugins": [
                {"type": "ptp", "ipMasq": false, "ipam": {
                    "type": "host-local", "subnet": "10.98.0.0/16",
                    "dataDir": root.path().join("host-local").display().to_string()}},
                {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}},
                {"type": "bandwidth", "capabilities": {"bandwidth": true}},
            ],
        }),
    )?;
    let ours = Containerd::start(
        &root.path().join("containerd-margay"),
        &lab.ns("node-1"),
        &cni,
        IMAGE,
    )?;
    let theirs = Containerd::start(
        &root.path().join("containerd-ref"),
        &lab.ns("node-2"),
        &reference,
        IMAGE,
    )?;
    let archive = img.oci_archive.display().to_string();
    for c in [&ours, &theirs] {
        c.ctr(&["-n", CRI_NAMESPACE, "images", "import", &archive])?;
    }
    println!("containerd: {}", ours.cri()?.version()?);
    let mut reference_times = run_batch(&theirs, n, "ptp+host-local")?;
    let mut margay_times = run_batch(&ours, n, "margay")?;
    let mut adds = logged_adds(&root.path().join("cni-node-1.log"));
    if adds.len() < n {
        return Err(format!("margay logged {} ADDs of {n}", adds.len()));
    }
    let left = runtime::held(&lab, "node-1", NETWORK)?;
    if !left.is_empty() {
        return Err(format!("left allocated after the teardown: {left:?}"));
    }
    let (r50, r99) = (
        percentile(&mut reference_times, 0.5),
        percentile(&mut reference_times, 0.99),
    );
    let (m50, m99) = (
        percentile(&mut margay_times, 0.5),
        percentile(&mut margay_times, 0.99),
    );
    println!("chain            RunPodSandbox p50   p99");
    println!("ptp+host-local   {:>17} {:>6}", ms(r50), ms(r99));
    println!("margay           {:>17} {:>6}", ms(m50), ms(m99));
    println!(
        "margay's own ADD (its log)   p50 {}  p99 {}",
        ms(percentile(&mut adds, 0.5)),
        ms(percentile(&mut adds, 0.99))
    );
    println!(
        "== {n} sandboxes at once: RunPodSandbox p99 margay / ptp+host-local = x{:.2} (p50 x{:.2}); nothing left allocated",
        m99.as_secs_f64() / r99.as_secs_f64(),
        m50.as_secs_f64() / r50.as_secs_f64()
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run(&Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("runtime-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
