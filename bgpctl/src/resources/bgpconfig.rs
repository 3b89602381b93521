//! BGPConfiguration ⇄ `BgpConfiguration`. Only the cluster-wide one, `default`, exists in
//! margay. Applying replaces the Calico fields (absent ones go back to their defaults, as
//! with calicoctl) and keeps margay's own settings that Calico's resource cannot express
//! (hold and keepalive times, pool aggregation, external transit, program external routes:
//! `bgpctl config set`).
//!
//! `logSeverityScreen` is accepted and not applied, with a warning: it sets the log level of
//! Calico's BIRD and confd, and bgpd's log level is its own configuration (`[log] level`).
//! Refusing it would make Calico's own default BGPConfiguration fail to apply.

use proto::v1 as pb;
use serde_json::{Value, json};

use super::fields::{FieldError, Result, as_number};
use super::{Document, Kind, document_value, parts, plain_metadata};

pub struct ConfigSpec {
    pub as_number: u32,
    pub node_to_node_mesh: Option<bool>,
    pub listen_port: u32,
    pub revision: u64,
    /// Fields accepted but not applied, each with why.
    pub warnings: Vec<String>,
}

pub fn from_document(doc: &Document) -> Result<ConfigSpec> {
    let p = parts(doc, &[])?;
    if doc.name != "default" {
        return Err(FieldError::new(
            "metadata.name",
            format!(
                "{:?}: only the cluster-wide BGPConfiguration \"default\" is supported \
                 (per-node ones, node.<name>, are not)",
                doc.name
            ),
        ));
    }
    plain_metadata(p.metadata, Kind::BgpConfiguration)?;
    let mut s = p.spec;
    let mut warnings = Vec::new();
    if let Some(level) = s.choice(
        "logSeverityScreen",
        &[
            "Trace", "Debug", "Info", "Warning", "Error", "Fatal", "None",
        ],
    )? {
        warnings.push(format!(
            "spec.logSeverityScreen: {level} not applied: bgpd's log level is set in its \
             configuration file ([log] level)"
        ));
    }
    let as_number = match s.take("asNumber") {
        Some(v) => as_number("spec.asNumber", v)?,
        None => 0,
    };
    let listen_port = s.uint("listenPort", 65535)?.unwrap_or(0) as u32;
    let mesh = s.bool("nodeToNodeMeshEnabled")?;
    let later = "not supported yet";
    for key in [
        "serviceClusterIPs",
        "serviceExternalIPs",
        "serviceLoadBalancerIPs",
        "communities",
        "prefixAdvertisements",
        "ignoredInterfaces",
    ] {
        s.refuse(key, later, &[json!([])])?;
    }
    s.refuse("bindMode", later, &[json!("None")])?;
    s.refuse("nodeMeshPassword", later, &[])?;
    s.refuse("nodeMeshMaxRestartTime", later, &[])?;
    s.refuse("localWorkloadPeeringIPV4", later, &[json!("")])?;
    s.refuse("localWorkloadPeeringIPV6", later, &[json!("")])?;
    s.refuse("programClusterRoutes", later, &[json!("Enabled")])?;
    s.finish()?;
    Ok(ConfigSpec {
        as_number,
        node_to_node_mesh: mesh,
        listen_port,
        revision: p.revision,
        warnings,
    })
}

impl ConfigSpec {
    /// The configuration to set, keeping `current`'s margay-only settings.
    pub fn request(&self, current: &pb::BgpConfiguration) -> pb::BgpConfiguration {
        pb::BgpConfiguration {
            as_number: self.as_number,
            node_to_node_mesh: self.node_to_node_mesh,
            listen_port: self.listen_port,
            service_cluster_cidrs: vec![],
            service_external_cidrs: vec![],
            revision: if self.revision != 0 {
                self.revision
            } else {
                current.revision
            },
            ..current.clone()
        }
    }
}

pub fn to_document(c: &pb::BgpConfiguration) -> Value {
    let mut spec = json!({
        "nodeToNodeMeshEnabled": c.node_to_node_mesh.unwrap_or(true),
    });
    if c.as_number != 0 {
        spec["asNumber"] = json!(c.as_number);
    }
    if c.listen_port != 0 {
        spec["listenPort"] = json!(c.listen_port);
    }
    document_value(Kind::BgpConfiguration, "default", c.revision, spec)
}
