//! A kubelet's side of the CRI, for tests: the calls a kubelet makes to run and end a pod, on
//! the `k8s-cri` crate's v1 bindings (crictl is not packaged in Debian), blocking, each on its
//! own small runtime so tests stay synchronous. Concurrent sandboxes go through
//! [`Cri::run_sandboxes`].

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

/// One pod as a kubelet describes it to the runtime.
#[derive(Debug, Clone, Default)]
pub struct PodSpec {
    pub namespace: String,
    pub name: String,
    /// (container port, host port), TCP.
    pub host_ports: Vec<(i32, i32)>,
    /// `kubernetes.io/egress-bandwidth`, e.g. "100M".
    pub egress_bandwidth: Option<String>,
}

impl PodSpec {
    pub fn new(namespace: &str, name: &str) -> PodSpec {
        PodSpec {
            namespace: namespace.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    /// The sandbox configuration a kubelet sends for this pod.
    pub fn config(&self) -> cri::PodSandboxConfig {
        let mut annotations = std::collections::HashMap::new();
        if let Some(b) = &self.egress_bandwidth {
            annotations.insert("kubernetes.io/egress-bandwidth".to_owned(), b.clone());
        }
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: self.name.clone(),
                uid: format!("uid-{}-{}", self.namespace, self.name),
                namespace: self.namespace.clone(),
                attempt: 0,
            }),
            hostname: self.name.clone(),
            port_mappings: self
                .host_ports
                .iter()
                .map(|&(container_port, host_port)| cri::PortMapping {
                    protocol: cri::Protocol::Tcp as i32,
                    container_port,
                    host_port,
                    host_ip: String::new(),
                })
                .collect(),
            annotations,
            linux: Some(cri::LinuxPodSandboxConfig::default()),
            ..Default::default()
        }
    }
}

pub struct Cri {
    rt: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
}

fn status(call: &str, e: tonic::Status) -> String {
    format!("{call}: {} ({:?})", e.message(), e.code())
}

impl Cri {
    /// Connects to a runtime's CRI socket.
    pub fn connect(socket: &Path) -> Result<Cri, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let channel = rt
            .block_on(proto::client::connect_unix(socket))
            .map_err(|e| e.to_string())?;
        Ok(Cri {
            rt,
            client: RuntimeServiceClient::new(channel),
        })
    }

    /// The runtime's name, version and CRI version.
    pub fn version(&mut self) -> Result<String, String> {
        let v = self
            .rt
            .block_on(self.client.version(cri::VersionRequest {
                version: "v1".into(),
            }))
            .map_err(|e| status("Version", e))?
            .into_inner();
        Ok(format!(
            "{} {} (CRI {})",
            v.runtime_name, v.runtime_version, v.runtime_api_version
        ))
    }

    /// RunPodSandbox: the sandbox's id.
    pub fn run_sandbox(&mut self, pod: &PodSpec) -> Result<String, String> {
        let r = self
            .rt
            .block_on(self.client.run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(pod.config()),
                runtime_handler: String::new(),
            }))
            .map_err(|e| status("RunPodSandbox", e))?;
        Ok(r.into_inner().pod_sandbox_id)
    }

    /// RunPodSandbox for every pod at once: per pod, its sandbox id (or the error) and how long
    /// the call took.
    pub fn run_sandboxes(&mut self, pods: &[PodSpec]) -> Vec<(Result<String, String>, Duration)> {
        let client = self.client.clone();
        self.rt.block_on(async move {
            let mut set = tokio::task::JoinSet::new();
            for (i, pod) in pods.iter().enumerate() {
                let mut c = client.clone();
                let config = pod.config();
                set.spawn(async move {
                    let t = Instant::now();
                    let r = c
                        .run_pod_sandbox(cri::RunPodSandboxRequest {
                            config: Some(config),
                            runtime_handler: String::new(),
                        })
                        .await
                        .map(|r| r.into_inner().pod_sandbox_id)
                        .map_err(|e| status("RunPodSandbox", e));
                    (i, r, t.elapsed())
                });
            }
            let mut out: Vec<Option<(Result<String, String>, Duration)>> =
                (0..pods.len()).map(|_| None).collect();
            while let Some(done) = set.join_next().await {
                if let Ok((i, r, d)) = done {
                    out[i] = Some((r, d));
                }
            }
            out.into_iter()
                .map(|o| o.unwrap_or((Err("the task panicked".into()), Duration::ZERO)))
                .collect()
        })
    }

    /// The sandbox's IP address and state ("SANDBOX_READY", ...).
    pub fn sandbox_ip(&mut self, id: &str) -> Result<(String, String), String> {
        let s = self
            .rt
            .block_on(
                self.client
                    .pod_sandbox_status(cri::PodSandboxStatusRequest {
                        pod_sandbox_id: id.into(),
                        verbose: false,
                    }),
            )
            .map_err(|e| status("PodSandboxStatus", e))?
            .into_inner()
            .status
            .ok_or("PodSandboxStatus: no status")?;
        let state = cri::PodSandboxState::try_from(s.state)
            .map(|st| st.as_str_name().to_owned())
            .unwrap_or_default();
        Ok((s.network.map(|n| n.ip).unwrap_or_default(), state))
    }

    /// The ids of the sandboxes the runtime knows.
    pub fn sandboxes(&mut self) -> Result<Vec<String>, String> {
        Ok(self
            .rt
            .block_on(
                self.client
                    .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None }),
            )
            .map_err(|e| status("ListPodSandbox", e))?
            .into_inner()
            .items
            .into_iter()
            .map(|s| s.id)
            .collect())
    }

    /// CreateContainer + StartContainer in the sandbox: `image`, `command`.
    pub fn start_container(
        &mut self,
        sandbox: &str,
        pod: &PodSpec,
        name: &str,
        image: &str,
        command: &[&str],
    ) -> Result<String, String> {
        let id = self
            .rt
            .block_on(self.client.create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox.into(),
                config: Some(cri::ContainerConfig {
                    metadata: Some(cri::ContainerMetadata {
                        name: name.into(),
                        attempt: 0,
                    }),
                    image: Some(cri::ImageSpec {
                        image: image.into(),
                        ..Default::default()
                    }),
                    command: command.iter().map(|s| s.to_string()).collect(),
                    ..Default::default()
                }),
                sandbox_config: Some(pod.config()),
            }))
            .map_err(|e| status("CreateContainer", e))?
            .into_inner()
            .container_id;
        self.rt
            .block_on(self.client.start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            }))
            .map_err(|e| status("StartContainer", e))?;
        Ok(id)
    }

    /// StopPodSandbox (the CNI DEL happens here).
    pub fn stop_sandbox(&mut self, id: &str) -> Result<(), String> {
        self.rt
            .block_on(self.client.stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            }))
            .map_err(|e| status("StopPodSandbox", e))?;
        Ok(())
    }

    pub fn remove_sandbox(&mut self, id: &str) -> Result<(), String> {
        self.rt
            .block_on(
                self.client
                    .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                        pod_sandbox_id: id.into(),
                    }),
            )
            .map_err(|e| status("RemovePodSandbox", e))?;
        Ok(())
    }
}
