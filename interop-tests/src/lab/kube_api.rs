//! A real Kubernetes API on loopback: etcd 3.7 (the `etcd-bin-vendored-linux-amd64` crate's
//! binary; Debian's 3.4 is older than Kubernetes supports) and the kube-apiserver that
//! `scripts/build-kube` builds from the `k8s.io/kubernetes` module into
//! `/var/cache/margay/kube-<release>/`. Set up as a cluster would be: TLS serving with a CA of
//! its own, client certificates from that CA (an admin in `system:masters`), RBAC
//! authorization, service-account token signing. Both processes are killed by PID when the
//! [`KubeApi`] is dropped; either can be killed and started again on the same data.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

/// The Kubernetes release `scripts/kube/go.mod` pins.
pub fn release() -> &'static str {
    const GO_MOD: &str = include_str!("../../../scripts/kube/go.mod");
    GO_MOD
        .lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("k8s.io/kubernetes"))
                .then(|| words.next())
                .flatten()
                .filter(|v| v.starts_with("v1."))
        })
        .expect("scripts/kube/go.mod requires k8s.io/kubernetes")
}

/// Where `scripts/build-kube` puts the binaries of the pinned release.
pub fn kube_dir() -> PathBuf {
    PathBuf::from(format!("/var/cache/margay/kube-{}", release()))
}

/// `kubectl` of the pinned release.
pub fn kubectl_path() -> PathBuf {
    kube_dir().join("kubectl")
}

/// etcd 3.7, from the crate that ships it.
pub fn etcd_path() -> PathBuf {
    match etcd_bin_vendored_linux_amd64::etcd_bin_path() {
        Ok(p) => p.to_path_buf(),
        Err(never) => match never {},
    }
}

/// etcd and a kube-apiserver over it, on 127.0.0.1.
pub struct KubeApi {
    dir: tempfile::TempDir,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    etcd_port: u16,
    etcd_peer_port: u16,
    /// The apiserver's HTTPS port.
    pub port: u16,
    /// An admin's kubeconfig (client certificate in `system:masters`).
    pub kubeconfig: PathBuf,
    /// More arguments of the apiserver, the test's own.
    extra: Vec<String>,
    /// The network namespace etcd, the apiserver and kubectl run in (`None`: the test's).
    netns: Option<String>,
    /// The apiserver's address in it.
    address: String,
}

impl KubeApi {
    /// Starts etcd and the apiserver and waits until the apiserver is ready. Panics naming
    /// the step that failed (and the apiserver's log) if it cannot be built or started.
    pub fn start() -> KubeApi {
        Self::start_with(&[])
    }

    /// As [`KubeApi::start`], the apiserver with `extra` arguments too.
    pub fn start_with(extra: &[&str]) -> KubeApi {
        Self::start_at(None, "127.0.0.1", extra)
    }

    /// As [`KubeApi::start`], in network namespace `netns` (its full name), serving on its
    /// `address`: for daemons in other namespaces that reach it over a segment. kubectl runs
    /// there too; [`KubeApi::client`], in the test's own namespace, cannot reach it.
    pub fn start_in(netns: &str, address: &str) -> KubeApi {
        Self::start_at(Some(netns.to_owned()), address, &[])
    }

    fn start_at(netns: Option<String>, address: &str, extra: &[&str]) -> KubeApi {
        let apiserver = kube_dir().join("kube-apiserver");
        assert!(
            apiserver.exists(),
            "{} is missing: run scripts/build-kube (./scripts/test does)",
            apiserver.display()
        );
        let dir = tempfile::tempdir().unwrap();
        write_pki(dir.path(), &[address, "127.0.0.1", "localhost"]);
        let kubeconfig = dir.path().join("kubeconfig");
        let mut api = KubeApi {
            etcd: None,
            apiserver: None,
            etcd_port: free_port(),
            etcd_peer_port: free_port(),
            extra: extra.iter().map(|a| (*a).to_owned()).collect(),
            port: free_port(),
            kubeconfig,
            dir,
            netns,
            address: address.to_owned(),
        };
        std::fs::write(&api.kubeconfig, kubeconfig_text(api.dir.path(), &api.url())).unwrap();
        api.start_etcd();
        api.start_apiserver();
        api
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `https://<address>:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}:{}", self.address, self.port)
    }

    /// `program` to run where etcd and the apiserver run.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(program);
                c
            }
            None => Command::new(program),
        }
    }

    /// The apiserver's PID while it runs.
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.as_ref().map(Child::id)
    }

    /// etcd's PID while it runs.
    pub fn etcd_pid(&self) -> Option<u32> {
        self.etcd.as_ref().map(Child::id)
    }

    pub fn start_etcd(&mut self) {
        let client = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer = format!("http://127.0.0.1:{}", self.etcd_peer_port);
        let mut cmd = self.command(etcd_path());
        super::etcd::member_args(
            &mut cmd,
            "kube-etcd",
            &self.dir.path().join("etcd"),
            &client,
            &peer,
        );
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).unwrap();
        self.etcd = Some(
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start etcd 3.7"),
        );
    }

    /// Starts the apiserver and waits (at most 90 s) until `/readyz` answers ok.
    pub fn start_apiserver(&mut self) {
        let d = self.dir.path();
        let log = std::fs::File::create(d.join("apiserver.log")).unwrap();
        let child = self
            .command(kube_dir().join("kube-apiserver"))
            .args(apiserver_args(
                d,
                &format!("http://127.0.0.1:{}", self.etcd_port),
                &self.address,
                self.port,
            ))
            // etcd's history compacted every 5 s (5 min by default), so that a test reaches
            // a watch's 410 Gone in seconds.
            .arg("--etcd-compaction-interval=5s")
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start kube-apiserver");
        self.apiserver = Some(child);
        self.wait_ready(Duration::from_secs(90));
    }

    /// Waits until `/readyz` says ok, through kubectl with the admin's certificate.
    pub fn wait_ready(&mut self, limit: Duration) {
        let started = Instant::now();
        loop {
            if let Some(Some(status)) = self.apiserver.as_mut().map(|c| c.try_wait().unwrap()) {
                panic!(
                    "kube-apiserver exited ({status}) while starting:\n{}",
                    self.apiserver_log_tail(40)
                );
            }
            let out = self.kubectl(&["get", "--raw", "/readyz"]);
            if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok" {
                return;
            }
            if started.elapsed() > limit {
                panic!(
                    "kube-apiserver not ready after {limit:?}: {}\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    self.apiserver_log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// kubectl of the pinned release, as the admin.
    pub fn kubectl(&self, args: &[&str]) -> std::process::Output {
        self.command(kubectl_path())
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// kubectl's stdout; panics with its stderr if it fails.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The Warning Events on object `name` (of any kind) in `namespace` (`default` for
    /// cluster-wide objects), as (reason, message, the object's uid as the Event names it).
    pub fn warnings(&self, namespace: &str, name: &str) -> Vec<(String, String, String)> {
        let selector = format!("involvedObject.name={name},type=Warning");
        let out = self.kubectl_ok(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &selector,
            "-o",
            "json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let text = |e: &serde_json::Value| e.as_str().unwrap_or_default().to_owned();
        v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    text(&e["reason"]),
                    text(&e["message"]),
                    text(&e["involvedObject"]["uid"]),
                )
            })
            .collect()
    }

    /// `kubectl apply` of the CRDs (`datastore/crds/`, Calico's and margay's) and of `files`,
    /// then waits until every CRD is served.
    pub fn apply_crds(&self, files: &[&str]) {
        let crds = super::repo_file("datastore/crds");
        let mut args = vec!["apply", "-R", "-f", crds.as_str()];
        for f in files {
            args.extend(["-f", f]);
        }
        self.kubectl_ok(&args);
        self.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "--all",
        ]);
    }

    /// `kubectl apply` of `manifest` (YAML or JSON, written as `name` into the apiserver's
    /// directory); kubectl's stdout, or a panic with its stderr.
    pub fn apply(&self, name: &str, manifest: &str) -> String {
        let file = self.dir().join(name);
        std::fs::write(&file, manifest).unwrap();
        self.kubectl_ok(&["apply", "-f", &file.display().to_string()])
    }

    /// Creates Pod `namespace/name` bound to `node` with `annotations`, as the scheduler
    /// leaves it (no kubelet runs: it stays Pending). The namespace's `default` account is
    /// made first if missing: admission wants it, and no controller-manager makes it here.
    pub fn create_pod(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        annotations: serde_json::Value,
    ) {
        let _ = self.kubectl(&["create", "serviceaccount", "default", "-n", namespace]);
        let manifest = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {"nodeName": node, "automountServiceAccountToken": false,
                     "containers": [{"name": "main", "image": "margay.invalid/none"}]},
        });
        let file = self.dir().join(format!("pod-{namespace}-{name}.json"));
        std::fs::write(&file, manifest.to_string()).unwrap();
        self.kubectl_ok(&["create", "-f", &file.display().to_string()]);
    }

    /// A kubeconfig (written into the apiserver's directory) of the service account
    /// `namespace/name`, which must exist: a token the apiserver issues for it (TokenRequest,
    /// valid two hours), so its requests are that account's and RBAC decides them.
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> PathBuf {
        let token = self.kubectl_ok(&["create", "token", name, "-n", namespace, "--duration=2h"]);
        let path = self.dir().join(format!("kubeconfig-{namespace}-{name}"));
        let credentials = format!("token: {}", token.trim());
        std::fs::write(
            &path,
            kubeconfig_of(self.dir(), &self.url(), name, &credentials),
        )
        .unwrap();
        path
    }

    pub fn apiserver_log_tail(&self, lines: usize) -> String {
        let log =
            std::fs::read_to_string(self.dir.path().join("apiserver.log")).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// kill -9 of the apiserver.
    pub fn kill_apiserver(&mut self) {
        kill(&mut self.apiserver);
    }

    /// kill -9 of etcd under the apiserver.
    pub fn kill_etcd(&mut self) {
        kill(&mut self.etcd);
    }

    /// A client of the API as the admin.
    pub async fn client(&self) -> kube::Client {
        let file = kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }
}

fn kill(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        kill(&mut self.apiserver);
        kill(&mut self.etcd);
    }
}

/// The arguments of a kube-apiserver whose certificates `write_pki` wrote into `dir`, over
/// the etcd at `etcd_url`, serving on `address:port`: TLS, client certificates of the CA,
/// RBAC, service-account tokens signed with the key in `dir`.
pub fn apiserver_args(dir: &Path, etcd_url: &str, address: &str, port: u16) -> Vec<String> {
    let file = |name: &str| dir.join(name).display().to_string();
    vec![
        format!("--etcd-servers={etcd_url}"),
        format!("--bind-address={address}"),
        format!("--advertise-address={address}"),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", file("certs")),
        format!("--tls-cert-file={}", file("apiserver.pem")),
        format!("--tls-private-key-file={}", file("apiserver-key.pem")),
        format!("--client-ca-file={}", file("ca.pem")),
        "--authorization-mode=RBAC".into(),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-account-key-file={}", file("sa.pub")),
        format!("--service-account-signing-key-file={}", file("sa-key.pem")),
        "--service-cluster-ip-range=10.96.0.0/16".into(),
        // No Service endpoints to keep for a lab apiserver that no pod reaches.
        "--endpoint-reconciler-type=none".into(),
        "--profiling=false".into(),
        "--v=1".into(),
    ]
}

/// Writes the CA, the apiserver's serving certificate (for `hosts`: addresses or names),
/// the admin's client certificate and the service-account key pair into `dir`.
pub fn write_pki(dir: &Path, hosts: &[&str]) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "margay lab kubernetes CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let ca = Issuer::new(ca_params, ca_key);

    let mut names: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
    names.push("kubernetes.default.svc".into());
    let mut serving = CertificateParams::new(names).unwrap();
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_key = KeyPair::generate().unwrap();
    let serving_pem = serving.signed_by(&serving_key, &ca).unwrap().pem();

    let mut admin = CertificateParams::new(Vec::<String>::new()).unwrap();
    admin
        .distinguished_name
        .push(DnType::CommonName, "margay-admin");
    admin
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_key = KeyPair::generate().unwrap();
    let admin_pem = admin.signed_by(&admin_key, &ca).unwrap().pem();

    let sa_key = KeyPair::generate().unwrap();
    for (name, text) in [
        ("ca.pem", ca_pem),
        ("apiserver.pem", serving_pem),
        ("apiserver-key.pem", serving_key.serialize_pem()),
        ("admin.pem", admin_pem),
        ("admin-key.pem", admin_key.serialize_pem()),
        ("sa.pub", sa_key.public_key_pem()),
        ("sa-key.pem", sa_key.serialize_pem()),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

/// The admin's kubeconfig for the apiserver at `server`, naming the certificate files
/// `write_pki` wrote into `dir`.
pub fn kubeconfig_text(dir: &Path, server: &str) -> String {
    let d = dir.display();
    kubeconfig_of(
        dir,
        server,
        "admin",
        &format!("client-certificate: {d}/admin.pem\n    client-key: {d}/admin-key.pem"),
    )
}

/// A kubeconfig for the apiserver at `server` (its CA in `dir`) as the user `name`, whose
/// credentials are `credentials` (the lines of its `user:` mapping).
fn kubeconfig_of(dir: &Path, server: &str, name: &str, credentials: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {server}\n    certificate-authority: {}/ca.pem\n\
         users:\n- name: {name}\n  user:\n    {credentials}\n\
         contexts:\n- name: lab\n  context:\n    cluster: lab\n    user: {name}\ncurrent-context: lab\n",
        dir.display()
    )
}
