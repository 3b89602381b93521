//! A validating admission webhook that tests serve to the real kube-apiserver, to see and to
//! cut one client's writes. The apiserver calls it for every write to the resources it is
//! registered for, before the write is made, in the order it admits them. The webhook records
//! the writes of one user (say bgpd's service account) and can kill that writer, by PID with
//! SIGKILL, when its n-th write arrives, and refuse that write. What is stored is then exactly
//! what the process wrote before its n-th write: a test kills bgpd between any two of its
//! datastore writes with no hook inside bgpd. Other users' writes pass, unrecorded.
//!
//! The server runs on a thread and runtime of its own, so a test may block on processes
//! while the apiserver waits for an answer. It speaks HTTP/1.1 over TLS (hyper and
//! tokio-rustls, which the workspace already builds for kube and tonic) with a certificate of
//! its own CA, which the webhook's configuration hands the apiserver as `caBundle`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

use super::kube_api::KubeApi;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use tokio_rustls::rustls;

/// What the webhook saw and what it is told to do.
#[derive(Default)]
struct State {
    /// The user whose writes are recorded and may be cut.
    user: String,
    /// That user's writes since the last `reset`: "OPERATION resource/name".
    writes: Vec<String>,
    /// Kill this PID when the user's write number `.0` (1-based, since `reset`) arrives.
    kill_at: Option<(usize, i32)>,
    /// The kill happened: the user's writes are refused until `reset`.
    killed: bool,
    /// Requests of any user (to know when the apiserver has started calling the webhook).
    calls: usize,
}

pub struct Webhook {
    /// `https://127.0.0.1:<port>/validate`.
    pub url: String,
    /// The CA that signed the webhook's certificate (the configuration's `caBundle`).
    pub ca_pem: String,
    state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Webhook {
    /// Serves the webhook on a free loopback port, recording `user`'s writes.
    pub fn start(user: &str) -> Webhook {
        let (ca_pem, config) = tls_config();
        let std_listener = std::net::TcpListener::bind(("127.0.0.1", super::free_port())).unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr: SocketAddr = std_listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            user: user.to_owned(),
            ..State::default()
        }));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let served = state.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(serve(std_listener, config, served, stopped));
        });
        Webhook {
            url: format!("https://{addr}/validate"),
            ca_pem,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// A `ValidatingWebhookConfiguration` named `name` sending this webhook every create,
    /// update and delete of the `rules`' resources, each (API group, resources; any version
    /// and scope). The apiserver refuses those writes while it cannot reach the webhook
    /// (`failurePolicy: Fail`): nothing gets past it unseen.
    pub fn configuration(
        &self,
        name: &str,
        rules: &[(&str, &[&str])],
    ) -> ValidatingWebhookConfiguration {
        let strings = |v: &[&str]| Some(v.iter().map(|s| (*s).to_owned()).collect());
        ValidatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            webhooks: Some(vec![ValidatingWebhook {
                name: format!("{name}.margay.dev"),
                client_config: WebhookClientConfig {
                    url: Some(self.url.clone()),
                    ca_bundle: Some(ByteString(self.ca_pem.as_bytes().to_vec())),
                    service: None,
                },
                rules: Some(
                    rules
                        .iter()
                        .map(|(group, resources)| RuleWithOperations {
                            api_groups: strings(&[group]),
                            api_versions: strings(&["*"]),
                            operations: strings(&["CREATE", "UPDATE", "DELETE"]),
                            resources: strings(resources),
                            scope: Some("*".into()),
                        })
                        .collect(),
                ),
                failure_policy: Some("Fail".into()),
                side_effects: "None".into(),
                admission_review_versions: vec!["v1".into()],
                timeout_seconds: Some(10),
                ..ValidatingWebhook::default()
            }]),
        }
    }

    /// Registers the webhook with `api` as `name` for `rules` (see
    /// [`Webhook::configuration`]; they must include Calico's IPAMHandles) and waits until
    /// the apiserver calls it: it takes up a new configuration a moment later, so the admin
    /// writes a probe handle until the webhook sees one. Then forgets what it saw.
    pub async fn register(&self, api: &KubeApi, name: &str, rules: &[(&str, &[&str])]) {
        Api::<ValidatingWebhookConfiguration>::all(api.client().await)
            .create(&PostParams::default(), &self.configuration(name, rules))
            .await
            .unwrap();
        let probe = api.dir().join("webhook-probe.json");
        std::fs::write(
            &probe,
            r#"{"apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMHandle",
                "metadata": {"name": "webhook-probe"}, "spec": {"handleID": "webhook-probe", "block": {}}}"#,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.calls() == 0 {
            assert!(
                Instant::now() < deadline,
                "the apiserver never called the webhook"
            );
            api.kubectl_ok(&["create", "-f", probe.to_str().unwrap()]);
            api.kubectl_ok(&[
                "delete",
                "ipamhandles.crd.projectcalico.org",
                "webhook-probe",
            ]);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.reset();
    }

    /// How many requests (of any user) the apiserver has sent so far.
    pub fn calls(&self) -> usize {
        self.state.lock().unwrap().calls
    }

    /// The user's writes since the last reset, in the order they were admitted.
    pub fn writes(&self) -> Vec<String> {
        self.state.lock().unwrap().writes.clone()
    }

    /// Forgets the writes seen, any kill to come and the refusal after one.
    pub fn reset(&self) {
        let mut s = self.state.lock().unwrap();
        s.writes.clear();
        s.kill_at = None;
        s.killed = false;
    }

    /// From now on (after a [`Webhook::reset`]): when the user's write number `write`
    /// arrives (1-based), SIGKILL `pid` and refuse that write and every later one.
    pub fn kill_at(&self, write: usize, pid: i32) {
        self.state.lock().unwrap().kill_at = Some((write, pid));
    }

    /// Whether the kill asked for by [`Webhook::kill_at`] happened.
    pub fn killed(&self) -> bool {
        self.state.lock().unwrap().killed
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A CA and a serving certificate for 127.0.0.1 signed by it: (the CA's PEM, rustls config).
fn tls_config() -> (String, Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let ca = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from(cert.der().to_vec())],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
    .unwrap();
    (ca_pem, Arc::new(config))
}

/// Accepts connections until `stopped`, each served on a task of its own.
async fn serve(
    listener: std::net::TcpListener,
    config: Arc<rustls::ServerConfig>,
    state: Arc<Mutex<State>>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    loop {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(_) => continue,
            },
            _ = &mut stopped => return,
        };
        let acceptor = acceptor.clone();
        let state = state.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(move |request| {
                let state = state.clone();
                async move { Ok::<_, hyper::Error>(review(request, &state).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
        });
    }
}

/// Answers one `AdmissionReview`: allowed, unless it is the user's write at which the test
/// stops the writer, or one after it.
async fn review(request: Request<Incoming>, state: &Mutex<State>) -> Response<Full<Bytes>> {
    let body = match request.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let review: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let req = &review["request"];
    let user = req["userInfo"]["username"].as_str().unwrap_or_default();
    let write = format!(
        "{} {}/{}",
        req["operation"].as_str().unwrap_or_default(),
        req["resource"]["resource"].as_str().unwrap_or_default(),
        req["name"].as_str().unwrap_or_default()
    );
    let allowed = {
        let mut s = state.lock().unwrap();
        s.calls += 1;
        if user != s.user {
            true
        } else if s.killed {
            false
        } else {
            s.writes.push(write);
            match s.kill_at {
                Some((n, pid)) if s.writes.len() == n => {
                    // SAFETY: kill(2) on a PID the test started and has not reaped.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    s.writes.pop();
                    s.killed = true;
                    false
                }
                _ => true,
            }
        }
    };
    let mut response = serde_json::json!({"uid": req["uid"], "allowed": allowed});
    if !allowed {
        response["status"] =
            serde_json::json!({"code": 403, "message": "the writer was stopped by the test"});
    }
    let answer = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    });
    Response::new(Full::new(Bytes::from(answer.to_string())))
}

/// What the admin (the lab's `margay-admin` certificate) writes to a fresh kube-apiserver:
/// its store (margay's CRDs installed) and a count of its writes to Calico's and margay's
/// resources and to Nodes, as the webhook sees them; and what must live as long as the store
/// (the apiserver, the webhook). The IPAM suite's run on the Kubernetes API counts the
/// writes the allocator makes with this, where SQLite counts its commits.
pub async fn counted_admin_store() -> (
    datastore::Store,
    Box<dyn std::any::Any>,
    Box<dyn Fn() -> u64>,
) {
    let api = KubeApi::start();
    let store = super::open_store(&format!("kubernetes:{}", api.kubeconfig.display()))
        .await
        .unwrap();
    store.as_kubernetes().unwrap().install_crds().await.unwrap();
    let webhook = Arc::new(Webhook::start("margay-admin"));
    webhook
        .register(
            &api,
            "admin-writes",
            &[
                ("crd.projectcalico.org", &["*"]),
                ("margay.dev", &["*"]),
                ("", &["nodes", "nodes/status"]),
            ],
        )
        .await;
    let counted = webhook.clone();
    (
        store,
        Box::new((webhook, api)),
        Box::new(move || counted.writes().len() as u64),
    )
}
