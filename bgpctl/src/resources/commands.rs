//! `bgpctl apply -f FILE|-`, `bgpctl get KIND [NAME] -o yaml|json`, `bgpctl delete -f FILE`
//! and `bgpctl delete KIND NAME`: the IO around the sans-IO mapping. Apply checks every
//! document, then reads what it needs of the stored state and checks again against it
//! (pool CIDRs, node tunnel addresses, the BGPFilters a BGPPeer names), and only then
//! applies, in file order.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Read;

use clap::{Args, ValueEnum};
use proto::v1 as pb;
use proto::v1::bgp_client::BgpClient;
use proto::v1::nodes_client::NodesClient;
use proto::v1::policy_client::PolicyClient;
use proto::v1::pools_client::PoolsClient;
use serde_json::Value;
use tonic::transport::Channel;

use super::bgpconfig::{self, ConfigSpec};
use super::fields::FieldError;
use super::ippool::{self, PoolSpec};
use super::node::{self, NodeSpec};
use super::{DocError, Document, Kind, bgpfilter, bgppeer, list_value, parse_file, policy, yaml};
use crate::{CtlError, Output};

#[derive(Args)]
pub struct ApplyArgs {
    /// A file of Calico v3 resources (one or many documents), or - for standard input.
    #[arg(short = 'f', long = "filename")]
    pub file: String,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Yaml,
    Json,
    /// A table (network-policy kinds only).
    Table,
}

#[derive(Args)]
pub struct GetArgs {
    /// ippool, bgpconfiguration, bgppeer, bgpfilter, node, networkpolicy (both dialects),
    /// k8snetworkpolicy, globalnetworkpolicy, workloadendpoint or namespace (plurals, short
    /// names and any case accepted).
    pub kind: String,
    /// One resource; all of the kind without it.
    pub name: Option<String>,
    #[arg(short = 'o', long = "output", value_enum, default_value = "yaml")]
    pub output: Format,
    /// The namespace of namespaced kinds.
    #[arg(short = 'n', long = "namespace", default_value = "default")]
    pub namespace: String,
    /// Every namespace.
    #[arg(short = 'A', long = "all-namespaces")]
    pub all_namespaces: bool,
}

#[derive(Args)]
pub struct DeleteArgs {
    /// What to delete: KIND NAME.
    pub kind: Option<String>,
    pub name: Option<String>,
    /// Delete the resources of a file (- for standard input) instead.
    #[arg(short = 'f', long = "filename", conflicts_with_all = ["kind", "name"])]
    pub file: Option<String>,
    /// The namespace of a namespaced KIND NAME.
    #[arg(short = 'n', long = "namespace", default_value = "default")]
    pub namespace: String,
}

fn read_input(file: &str) -> Result<String, CtlError> {
    let mut text = String::new();
    let r = if file == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(file).map(|t| text = t)
    };
    r.map_err(|e| CtlError::Invalid(format!("cannot read {file}: {e}")))?;
    Ok(text)
}

pub(super) enum Checked {
    Pool(PoolSpec),
    Config(ConfigSpec),
    Peer(pb::BgpPeer),
    Filter(pb::BgpFilter),
    Node(NodeSpec),
    /// A network-policy document, checked, as JSON.
    Policy(String),
}

pub(super) fn check(doc: &Document) -> Result<Checked, DocError> {
    if doc.kind.is_policy_document() {
        return policy::check(doc)
            .map(Checked::Policy)
            .map_err(|e| doc.error(e));
    }
    let r = match doc.kind {
        Kind::IpPool => ippool::from_document(doc).map(Checked::Pool),
        Kind::BgpConfiguration => bgpconfig::from_document(doc).map(Checked::Config),
        Kind::BgpPeer => bgppeer::from_document(doc).map(Checked::Peer),
        Kind::BgpFilter => bgpfilter::from_document(doc).map(Checked::Filter),
        Kind::Node => node::from_document(doc).map(Checked::Node),
        _ => unreachable!("policy documents are checked above"),
    };
    r.map_err(|e| doc.error(e))
}

/// Every document checked on its own, and no resource given twice.
fn check_all(docs: &[Document]) -> Result<Vec<Checked>, CtlError> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for d in docs {
        if !seen.insert((d.kind, d.namespace.clone(), d.name.clone())) {
            return Err(invalid(d.error(super::fields::FieldError::new(
                "metadata.name",
                "this resource is given twice in the file",
            ))));
        }
        out.push(check(d).map_err(invalid)?);
    }
    Ok(out)
}

fn invalid(e: DocError) -> CtlError {
    CtlError::Invalid(e.to_string())
}

/// One call to bgpd, decided before any is made.
pub(super) enum Action {
    CreatePool(pb::IpPool),
    UpdatePool(pb::IpPool),
    SetConfig(pb::BgpConfiguration),
    AddPeer(pb::BgpPeer),
    ApplyFilter(pb::BgpFilter),
    RegisterNode(pb::Node),
    ApplyDocument(String),
}

/// What bgpd has now, as far as the file needs it.
#[derive(Default)]
pub(super) struct State {
    pub(super) pools: BTreeMap<String, pb::IpPool>,
    pub(super) config: Option<pb::BgpConfiguration>,
    pub(super) nodes: BTreeMap<String, pb::Node>,
    /// The stored BGPFilters' names.
    pub(super) filters: BTreeSet<String>,
}

/// Refuses a peer naming a BGPFilter that is neither stored nor applied before it in the
/// file: until it exists the session would run without it (bgpd skips a missing filter).
fn check_filters(
    peer: &pb::BgpPeer,
    known: &BTreeSet<String>,
    in_file: &BTreeSet<&str>,
) -> Result<(), FieldError> {
    for (i, f) in peer.filters.iter().enumerate() {
        if known.contains(f) {
            continue;
        }
        let why = if in_file.contains(f.as_str()) {
            format!("BGPFilter {f:?} comes later in the file: put it before this BGPPeer")
        } else {
            format!("no BGPFilter {f:?}: apply it first or in the same file")
        };
        return Err(FieldError::new(format!("spec.filters[{i}]"), why));
    }
    Ok(())
}

/// The calls to make, checked against the stored state (sans-IO).
pub(super) fn plan(
    docs: &[Document],
    checked: &[Checked],
    state: &State,
) -> Result<Vec<Action>, DocError> {
    let mut actions = Vec::new();
    // Every pool's CIDR as it will be once the file's pools before it are applied.
    let mut cidrs: BTreeMap<String, String> = state
        .pools
        .values()
        .map(|p| (p.name.clone(), p.cidr.clone()))
        .collect();
    let in_file: BTreeSet<&str> = docs
        .iter()
        .filter(|d| d.kind == Kind::BgpFilter)
        .map(|d| d.name.as_str())
        .collect();
    // The filters stored once the file's documents before this one are applied.
    let mut filters = state.filters.clone();
    for (doc, c) in docs.iter().zip(checked) {
        if let Checked::Peer(p) = c {
            check_filters(p, &filters, &in_file).map_err(|e| doc.error(e))?;
        }
        if let Checked::Filter(f) = c {
            filters.insert(f.name.clone());
        }
        if let Checked::Pool(p) = c {
            ippool::check_overlap(&p.pool, cidrs.iter().map(|(n, c)| (n.as_str(), c.as_str())))
                .map_err(|e| doc.error(e))?;
            cidrs.insert(doc.name.clone(), p.pool.cidr.clone());
        }
        actions.push(match c {
            Checked::Pool(p) => match state.pools.get(&doc.name) {
                Some(cur) => Action::UpdatePool(ippool::update_of(p, cur).map_err(|e| doc.error(e))?),
                None if p.pool.revision != 0 => {
                    return Err(doc.error(super::fields::FieldError::new(
                        "metadata.resourceVersion",
                        "the pool does not exist (any more): leave resourceVersion out to create it",
                    )));
                }
                None => Action::CreatePool(p.pool.clone()),
            },
            Checked::Config(c) => {
                Action::SetConfig(c.request(state.config.as_ref().unwrap_or(&Default::default())))
            }
            Checked::Peer(p) => Action::AddPeer(p.clone()),
            Checked::Filter(f) => Action::ApplyFilter(f.clone()),
            Checked::Node(n) => Action::RegisterNode(
                n.request(state.nodes.get(&doc.name)).map_err(|e| doc.error(e))?,
            ),
            Checked::Policy(json) => Action::ApplyDocument(json.clone()),
        });
    }
    Ok(actions)
}

#[expect(
    clippy::too_many_lines,
    reason = "`apply` in order: parse and check the file, read the stored state of the kinds it touches, plan, then write each document; the steps share the four clients and the plan"
)]
pub async fn apply(channel: Channel, args: ApplyArgs, out: &mut Output) -> Result<(), CtlError> {
    let text = read_input(&args.file)?;
    let docs = parse_file(&text).map_err(invalid)?;
    if docs.is_empty() {
        return Err(CtlError::Invalid(format!(
            "{}: no resources in it",
            args.file
        )));
    }
    let checked = check_all(&docs)?;
    let mut state = State::default();
    let mut pools = PoolsClient::new(channel.clone());
    let mut bgp = BgpClient::new(channel.clone());
    let mut nodes = NodesClient::new(channel.clone());
    let mut documents = PolicyClient::new(channel);
    if checked.iter().any(|c| matches!(c, Checked::Pool(_))) {
        for p in pools
            .list_pools(pb::ListPoolsRequest {})
            .await?
            .into_inner()
            .pools
        {
            state.pools.insert(p.name.clone(), p);
        }
    }
    if checked.iter().any(|c| matches!(c, Checked::Config(_))) {
        state.config = Some(
            bgp.get_configuration(pb::GetConfigurationRequest {})
                .await?
                .into_inner(),
        );
    }
    if checked
        .iter()
        .any(|c| matches!(c, Checked::Peer(p) if !p.filters.is_empty()))
    {
        state.filters = bgp
            .list_bgp_filters(pb::ListBgpFiltersRequest {})
            .await?
            .into_inner()
            .filters
            .into_iter()
            .map(|f| f.name)
            .collect();
    }
    if checked.iter().any(|c| matches!(c, Checked::Node(_))) {
        for n in nodes
            .list_nodes(pb::ListNodesRequest {})
            .await?
            .into_inner()
            .nodes
        {
            state.nodes.insert(n.name.clone(), n);
        }
    }
    let actions = plan(&docs, &checked, &state).map_err(invalid)?;
    for c in &checked {
        if let Checked::Config(c) = c {
            for w in &c.warnings {
                eprintln!("bgpctl: warning: {w}");
            }
        }
    }
    for (i, (doc, action)) in docs.iter().zip(actions).enumerate() {
        let verb = match &action {
            Action::CreatePool(_) => "created",
            _ => "configured",
        };
        let r = match action {
            Action::CreatePool(p) => pools
                .create_pool(pb::CreatePoolRequest { pool: Some(p) })
                .await
                .map(drop),
            Action::UpdatePool(p) => pools
                .update_pool(pb::UpdatePoolRequest { pool: Some(p) })
                .await
                .map(drop),
            Action::SetConfig(c) => bgp
                .set_configuration(pb::SetConfigurationRequest {
                    configuration: Some(c),
                })
                .await
                .map(drop),
            Action::AddPeer(p) => bgp
                .add_peer(pb::AddPeerRequest { peer: Some(p) })
                .await
                .map(drop),
            Action::ApplyFilter(f) => bgp
                .apply_bgp_filter(pb::ApplyBgpFilterRequest { filter: Some(f) })
                .await
                .map(drop),
            Action::RegisterNode(n) => nodes
                .register_node(pb::RegisterNodeRequest { node: Some(n) })
                .await
                .map(drop),
            Action::ApplyDocument(json) => documents
                .apply(pb::ApplyDocumentRequest { json })
                .await
                .map(drop),
        };
        if let Err(s) = r {
            let done = if i == 0 {
                "nothing was applied".to_owned()
            } else {
                format!("documents 1-{i} were applied")
            };
            return Err(CtlError::Invalid(format!(
                "document {} ({} {}): bgpd refused it: {} ({:?}); {done}",
                doc.index,
                doc.kind.name(),
                doc.name,
                s.message(),
                s.code()
            )));
        }
        let name = if doc.kind.namespaced() {
            format!("{}/{}", doc.namespace, doc.name)
        } else {
            doc.name.clone()
        };
        out.line(&format!("{} {name} {verb}", doc.kind.name()))?;
    }
    Ok(())
}

#[expect(
    clippy::too_many_lines,
    reason = "one match arm per resource kind for `get`, each reading that kind from its service and turning it into Calico documents"
)]
pub async fn get(channel: Channel, args: GetArgs, out: &mut Output) -> Result<(), CtlError> {
    let kind = Kind::parse(&args.kind, true).map_err(CtlError::Invalid)?;
    let name = args.name.as_deref();
    if kind.is_policy_document() {
        let namespace = if args.all_namespaces || !kind.namespaced() {
            ""
        } else {
            args.namespace.as_str()
        };
        let mut docs = policy::list(channel, kind, namespace, name).await?;
        let value = if name.is_some() && docs.len() == 1 {
            docs.remove(0)
        } else {
            policy::list_value(kind, docs.clone())
        };
        return match args.output {
            Format::Table => out.text(&policy::table(kind, &docs)),
            Format::Json => out.text(&format!(
                "{}\n",
                serde_json::to_string_pretty(&value)
                    .map_err(|e| CtlError::Invalid(e.to_string()))?
            )),
            Format::Yaml => out.text(&yaml::emit(&value).map_err(CtlError::Invalid)?),
        };
    }
    if args.output == Format::Table {
        return Err(CtlError::Invalid(format!(
            "-o table is for the network-policy kinds; {} is printed as yaml or json",
            kind.name()
        )));
    }
    let mut docs: Vec<Value> = match kind {
        Kind::IpPool => {
            let mut c = PoolsClient::new(channel);
            match name {
                Some(n) => vec![
                    c.get_pool(pb::GetPoolRequest { name: n.into() })
                        .await?
                        .into_inner(),
                ],
                None => {
                    c.list_pools(pb::ListPoolsRequest {})
                        .await?
                        .into_inner()
                        .pools
                }
            }
            .iter()
            .map(ippool::to_document)
            .collect()
        }
        Kind::BgpConfiguration => {
            if name.is_some_and(|n| n != "default") {
                return Err(CtlError::Invalid(
                    "only the BGPConfiguration \"default\" exists in margay".into(),
                ));
            }
            let c = BgpClient::new(channel)
                .get_configuration(pb::GetConfigurationRequest {})
                .await?
                .into_inner();
            vec![bgpconfig::to_document(&c)]
        }
        Kind::BgpPeer => {
            let peers = BgpClient::new(channel)
                .list_bgp_peer_resources(pb::ListBgpPeerResourcesRequest {})
                .await?
                .into_inner()
                .peers;
            let peers = named(kind, name, peers, |p| &p.name)?;
            for p in &peers {
                let hidden = bgppeer::not_in_document(p);
                if !hidden.is_empty() {
                    eprintln!(
                        "bgpctl: warning: BGPPeer {}: {} not shown (a Calico BGPPeer cannot \
                         carry them; set with bgpctl peer add --resource): applying this \
                         document back clears them",
                        p.name,
                        hidden.join(", ")
                    );
                }
            }
            peers.iter().map(bgppeer::to_document).collect()
        }
        Kind::BgpFilter => {
            let filters = BgpClient::new(channel)
                .list_bgp_filters(pb::ListBgpFiltersRequest {})
                .await?
                .into_inner()
                .filters;
            named(kind, name, filters, |f| &f.name)?
                .iter()
                .map(bgpfilter::to_document)
                .collect()
        }
        Kind::Node => {
            let mut c = NodesClient::new(channel);
            match name {
                Some(n) => vec![
                    c.get_node(pb::GetNodeRequest { name: n.into() })
                        .await?
                        .into_inner(),
                ],
                None => {
                    c.list_nodes(pb::ListNodesRequest {})
                        .await?
                        .into_inner()
                        .nodes
                }
            }
            .iter()
            .map(node::to_document)
            .collect()
        }
        _ => unreachable!("policy documents are listed above"),
    };
    let value = if name.is_some() {
        docs.remove(0)
    } else {
        list_value(kind, docs)
    };
    match args.output {
        Format::Json => out.text(&format!(
            "{}\n",
            serde_json::to_string_pretty(&value).map_err(|e| CtlError::Invalid(e.to_string()))?
        )),
        Format::Yaml => out.text(&yaml::emit(&value).map_err(CtlError::Invalid)?),
        Format::Table => unreachable!("refused above"),
    }
}

/// All of a listing, or only the one named (NOT_FOUND if it is not there).
fn named<T>(
    kind: Kind,
    name: Option<&str>,
    mut all: Vec<T>,
    name_of: impl Fn(&T) -> &String,
) -> Result<Vec<T>, CtlError> {
    let Some(n) = name else {
        return Ok(all);
    };
    all.retain(|x| name_of(x) == n);
    if all.is_empty() {
        return Err(CtlError::Status {
            code: tonic::Code::NotFound,
            message: format!("{} {n} not found", kind.name()),
        });
    }
    Ok(all)
}

pub async fn delete(channel: Channel, args: DeleteArgs, out: &mut Output) -> Result<(), CtlError> {
    let targets: Vec<(Kind, String, String)> = match (&args.file, &args.kind, &args.name) {
        (Some(f), _, _) => {
            let docs = parse_file(&read_input(f)?).map_err(invalid)?;
            docs.into_iter()
                .map(|d| (d.kind, d.namespace, d.name))
                .collect()
        }
        (None, Some(k), Some(n)) => {
            let kind = Kind::parse(k, true).map_err(CtlError::Invalid)?;
            let ns = if kind.namespaced() {
                args.namespace.clone()
            } else {
                String::new()
            };
            vec![(kind, ns, n.clone())]
        }
        _ => {
            return Err(CtlError::Invalid(
                "delete: give KIND NAME or -f FILE".into(),
            ));
        }
    };
    for (kind, _, name) in &targets {
        if *kind == Kind::BgpConfiguration && name != "default" {
            return Err(CtlError::Invalid(format!(
                "BGPConfiguration {name}: only \"default\" exists in margay; nothing was deleted"
            )));
        }
    }
    for (kind, namespace, name) in targets {
        if kind.is_policy_document() {
            policy::delete(channel.clone(), kind, &namespace, &name).await?;
            let shown = if kind.namespaced() {
                format!("{namespace}/{name}")
            } else {
                name
            };
            out.line(&format!("{} {shown} deleted", kind.name()))?;
            continue;
        }
        match kind {
            Kind::IpPool => {
                PoolsClient::new(channel.clone())
                    .delete_pool(pb::DeletePoolRequest { name: name.clone() })
                    .await?;
            }
            Kind::BgpPeer => {
                BgpClient::new(channel.clone())
                    .delete_peer(pb::DeletePeerRequest { peer: name.clone() })
                    .await?;
            }
            Kind::BgpFilter => {
                BgpClient::new(channel.clone())
                    .delete_bgp_filter(pb::DeleteBgpFilterRequest { name: name.clone() })
                    .await?;
            }
            Kind::Node => {
                NodesClient::new(channel.clone())
                    .delete_node(pb::DeleteNodeRequest { name: name.clone() })
                    .await?;
            }
            Kind::BgpConfiguration => {
                // As with Calico, deleting it means the defaults again (margay's own
                // settings are kept).
                let mut c = BgpClient::new(channel.clone());
                let cur = c
                    .get_configuration(pb::GetConfigurationRequest {})
                    .await?
                    .into_inner();
                let reset = ConfigSpec::default().request(&cur);
                c.set_configuration(pb::SetConfigurationRequest {
                    configuration: Some(reset),
                })
                .await?;
            }
            _ => unreachable!("policy documents are deleted above"),
        }
        out.line(&format!("{} {name} deleted", kind.name()))?;
    }
    Ok(())
}
