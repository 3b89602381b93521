//! The Kubernetes API as margay's datastore (Calico's "Kubernetes API datastore"): each object
//! is one resource, its version the resource's `resourceVersion` (an etcd revision on every
//! etcd-backed apiserver, which [`Version`] holds). It keeps the core contract
//! ([`Datastore`]), not the [`Atomic`] extension: the apiserver has no multi-object
//! transaction, so the allocator takes its per-object path here.
//!
//! - Calico's kinds live in Calico's CRDs (`crd.projectcalico.org/v1`) in Calico's layout,
//!   through each kind's [`CrdCodec`] (`ipam::calico`, `crate::crd::model_codecs`); margay's
//!   nodes are annotations on Kubernetes `Node`s (`nodes`); the policy documents are the
//!   cluster's own NetworkPolicies, Calico's policy resources, Namespaces, and endpoints
//!   derived from Pods (`documents`); margay-only kinds go into margay's own CRD
//!   (`margayobjects.margay.dev`, [`ObjectCodec`]); Services and EndpointSlices are read.
//! - Compare-and-swap is the apiserver's: a PUT carrying `metadata.resourceVersion`, a DELETE
//!   with a `resourceVersion` precondition; 409 is a [`StoreError::Conflict`] whose caller
//!   reads again, never a blind overwrite.
//! - A watch is the apiserver's from a list's `resourceVersion`, with bookmarks, resumed from
//!   the last version seen when the server ends it; `410 Gone` ends it with
//!   [`StoreError::TooOld`] so its user lists again.
//!
//! Why this file is long: the contract's requests, the watch loop, the CRDs' installation
//! and margay's own objects' codec, over one client.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
    Preconditions, WatchEvent, WatchParams,
};
use tokio::sync::mpsc;

use crate::contract::{
    Datastore, Kind, Object, ObjectEvent, ObjectList, ObjectWatch, Result, StoreError, Version,
    Watch,
};
use crate::crd::{CodecError, CrdCodec, CrdObject, keep_unmodelled, manifests};
use crate::resource::Resource;

mod documents;
mod events;
mod nodes;
mod services;

pub use documents::PodState;
pub use events::EventSubject;
pub use services::{ServiceFacts, SliceFacts};

/// margay's own CRD, for the kinds Calico keeps nowhere in the Kubernetes API.
pub const MARGAY_OBJECTS_CRD: &str = include_str!("../crds/margay/objects.yaml");
const MARGAY_GROUP: &str = "margay.dev";
/// The objects of one list request; the rest come with its continue token.
const PAGE: u32 = 500;
/// How long the apiserver keeps one watch request open before we resume it.
const WATCH_SECONDS: u32 = 290;

/// A datastore in the Kubernetes API. Cheap to clone: clones share the client.
#[derive(Clone)]
pub struct KubeStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    codecs: HashMap<Kind, Arc<dyn CrdCodec>>,
    describe: String,
}

impl KubeStore {
    /// A store over `client`, with this crate's codecs and `codecs` (the other crates' kinds).
    pub fn new(client: kube::Client, codecs: Vec<Box<dyn CrdCodec>>, describe: String) -> Self {
        let mut by_kind: HashMap<Kind, Arc<dyn CrdCodec>> = HashMap::new();
        for codec in crate::crd::model_codecs::codecs().into_iter().chain(codecs) {
            by_kind.insert(codec.kind(), Arc::from(codec));
        }
        KubeStore {
            inner: Arc::new(Inner {
                client,
                codecs: by_kind,
                describe,
            }),
        }
    }

    /// Connects with the kubeconfig at `kubeconfig`, or in a pod with its service account.
    pub async fn connect(
        kubeconfig: Option<&Path>,
        codecs: Vec<Box<dyn CrdCodec>>,
    ) -> Result<Self> {
        let config = match kubeconfig {
            Some(path) => {
                let file = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                    StoreError::Backend(format!(
                        "cannot read the kubeconfig {}: {e}; set datastore.kubeconfig",
                        path.display()
                    ))
                })?;
                kube::Config::from_custom_kubeconfig(file, &Default::default())
                    .await
                    .map_err(|e| {
                        StoreError::Backend(format!("kubeconfig {}: {e}", path.display()))
                    })?
            }
            None => kube::Config::incluster().map_err(|e| {
                StoreError::Backend(format!(
                    "not in a pod ({e}): set datastore.kubeconfig to reach the Kubernetes API"
                ))
            })?,
        };
        let describe = format!("kubernetes:{}", config.cluster_url);
        let client = kube::Client::try_from(config)
            .map_err(|e| StoreError::Backend(format!("Kubernetes client: {e}")))?;
        Ok(Self::new(client, codecs, describe))
    }

    pub fn client(&self) -> &kube::Client {
        &self.inner.client
    }

    /// The codec of `kind`: its own, or margay's objects CRD for kinds Calico does not keep.
    fn codec(&self, kind: Kind) -> Arc<dyn CrdCodec> {
        match self.inner.codecs.get(&kind) {
            Some(c) => c.clone(),
            None => Arc::new(ObjectCodec { kind }),
        }
    }

    fn api(&self, codec: &dyn CrdCodec) -> (Api<DynamicObject>, ApiResource) {
        let gvk = GroupVersionKind::gvk(codec.group(), crate::crd::VERSION, codec.crd_kind());
        let resource = ApiResource::from_gvk_with_plural(&gvk, codec.plural());
        (
            Api::all_with(self.inner.client.clone(), &resource),
            resource,
        )
    }

    /// Installs the CRDs margay uses that the cluster does not have yet (Calico's and
    /// margay's own), and waits until the apiserver serves them. Existing CRDs are left as
    /// they are: a Calico cluster's own definitions stay in charge. Returns the names created.
    pub async fn install_crds(&self) -> Result<Vec<String>> {
        let api: Api<CustomResourceDefinition> = Api::all(self.inner.client.clone());
        // A Calico 3.32 cluster in its v3 mode keeps IPAM in `projectcalico.org` CRDs: v1
        // CRDs beside them would be an empty second store, whose blocks margay would hand
        // out again (and which Calico would switch to on its next start).
        if api
            .get_opt("ipamblocks.projectcalico.org")
            .await
            .map_err(|e| request_error(e, "CRD ipamblocks.projectcalico.org"))?
            .is_some()
        {
            return Err(StoreError::Backend(
                "this cluster keeps Calico's state in projectcalico.org/v3 CRDs (Calico 3.32's v3 mode), which margay does not read; nothing was installed (see README, the Kubernetes datastore)".into(),
            ));
        }
        let yamls = manifests::ALL
            .iter()
            .map(|m| m.yaml)
            .chain(std::iter::once(MARGAY_OBJECTS_CRD));
        let (mut created, mut waiting, mut failed) = (Vec::new(), Vec::new(), Vec::new());
        for yaml in yamls {
            let crd: CustomResourceDefinition = serde_saphyr::from_str(yaml)
                .map_err(|e| StoreError::Backend(format!("a built-in CRD does not parse: {e}")))?;
            let name = crd.metadata.name.clone().unwrap_or_default();
            match api.get_opt(&name).await {
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => {
                    failed.push(request_error(e, &name).to_string());
                    continue;
                }
            }
            // Every CRD is tried: one refused must not keep the others from the cluster.
            match api.create(&PostParams::default(), &crd).await {
                Ok(_) => created.push(name),
                // Another node was first: wait for it all the same.
                Err(kube::Error::Api(s)) if s.code == 409 => waiting.push(name),
                Err(e) => failed.push(request_error(e, &name).to_string()),
            }
        }
        for name in created.iter().chain(&waiting) {
            wait_established(&api, name).await?;
        }
        if !failed.is_empty() {
            return Err(StoreError::Backend(format!(
                "{} CRD(s) could not be installed (apply datastore/crds/ with kubectl): {}",
                failed.len(),
                failed.join("; ")
            )));
        }
        Ok(created)
    }

    /// Deletes the resource of margay's `name` if Calico marked it deleted (it stands for no
    /// object); whether it was such a leftover.
    async fn finish_marked(
        &self,
        api: &Api<DynamicObject>,
        codec: &dyn CrdCodec,
        name: &str,
    ) -> Result<bool> {
        let resource = codec.resource_name(name);
        let Some(found) = fetch(api, codec, name).await? else {
            return Ok(false);
        };
        if codec
            .decode(&crd_object(&found))
            .map_err(codec_error)?
            .is_some()
        {
            return Ok(false);
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: found.metadata.resource_version.clone(),
                uid: found.metadata.uid.clone(),
            }),
            ..DeleteParams::default()
        };
        match api.delete(&resource, &params).await {
            Ok(_) => Ok(true),
            Err(e) if matches!(http_code(&e), Some(404 | 409)) => Ok(true),
            Err(e) => Err(request_error(e, &resource)),
        }
    }

    /// The object's current version, for a conflict's report.
    async fn version_now(&self, codec: &dyn CrdCodec, name: &str) -> Option<Version> {
        let (api, _) = self.api(codec);
        let found = fetch(&api, codec, name).await.ok()??;
        version_of(found.metadata.resource_version.as_deref()).ok()
    }

    async fn conflict(
        &self,
        codec: &dyn CrdCodec,
        name: &str,
        expected: Option<Version>,
    ) -> StoreError {
        StoreError::Conflict {
            key: format!("{} {name}", codec.kind().name),
            expected,
            actual: self.version_now(codec, name).await,
        }
    }
}

/// The resource holding margay's object `name`, if there is one.
async fn fetch(
    api: &Api<DynamicObject>,
    codec: &dyn CrdCodec,
    name: &str,
) -> Result<Option<DynamicObject>> {
    let resource = codec.resource_name(name);
    api.get_opt(&resource)
        .await
        .map_err(|e| request_error(e, &resource))
}

/// margay's objects among the resources of `api` that `selector` picks, with names starting
/// with `name_prefix`, sorted, and the version to watch from: page by page from one snapshot
/// (from the first page again, at a newer one, if the continue token expired). `object`
/// reads one resource at its version; one it cannot read is skipped and said, and stays as
/// it is in the store: it must not hide the others.
pub(super) async fn list_objects<K>(
    api: &Api<K>,
    selector: Option<String>,
    what: &str,
    name_prefix: &str,
    object: impl Fn(&K, Version) -> std::result::Result<Option<Object>, String>,
) -> Result<ObjectList>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = ListParams::default().limit(PAGE);
    params.label_selector = selector;
    let mut items = Vec::new();
    let version = loop {
        let page = match api.list(&params).await {
            Ok(page) => page,
            Err(e) if http_code(&e) == Some(410) && params.continue_token.is_some() => {
                params.continue_token = None;
                items.clear();
                continue;
            }
            Err(e) => return Err(request_error(e, what)),
        };
        for resource in &page.items {
            let version = version_of(resource.meta().resource_version.as_deref())?;
            match object(resource, version) {
                Ok(Some(o)) if o.name.starts_with(name_prefix) => items.push(o),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(%what, error = %e, "skipping a stored object margay cannot read")
                }
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params.continue_token = Some(token),
            None => break version_of(page.metadata.resource_version.as_deref())?,
        }
    };
    items.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(ObjectList { items, version })
}

/// Waits until the apiserver reports the CRD `name` Established (at most 30 s).
async fn wait_established(api: &Api<CustomResourceDefinition>, name: &str) -> Result<()> {
    for _ in 0..300 {
        let crd = api.get(name).await.map_err(|e| request_error(e, name))?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(StoreError::Unavailable(format!(
        "the apiserver did not establish the CRD {name} within 30 s"
    )))
}

/// A request's failure as the contract names it. Conflicts (409) and absence (404) are the
/// callers' to map; here they are only what is left.
pub(super) fn request_error(e: kube::Error, what: &str) -> StoreError {
    match e {
        kube::Error::Api(s) if matches!(s.code, 408 | 429 | 500 | 502 | 503 | 504) => {
            StoreError::Unavailable(format!("{what}: {} ({})", s.message, s.code))
        }
        kube::Error::Api(s) => {
            StoreError::Backend(format!("{what}: {} ({} {})", s.message, s.code, s.reason))
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) => {
            StoreError::Unavailable(format!("{what}: the Kubernetes API cannot be reached: {e}"))
        }
        other => StoreError::Backend(format!("{what}: {other}")),
    }
}

pub(super) fn http_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// A resource version as margay's [`Version`].
pub(super) fn version_of(resource_version: Option<&str>) -> Result<Version> {
    let rv = resource_version.unwrap_or_default();
    rv.parse().map(Version::from_wire).map_err(|_| {
        StoreError::Backend(format!(
            "resourceVersion {rv:?} is not a number: margay needs an apiserver whose storage is etcd"
        ))
    })
}

fn codec_error(e: CodecError) -> StoreError {
    StoreError::Backend(format!("a stored object margay cannot read: {e}"))
}

/// The codec's view of a resource.
fn crd_object(d: &DynamicObject) -> CrdObject {
    CrdObject {
        name: d.metadata.name.clone().unwrap_or_default(),
        labels: d.metadata.labels.clone().unwrap_or_default(),
        annotations: d.metadata.annotations.clone().unwrap_or_default(),
        spec: d
            .data
            .get("spec")
            .cloned()
            .unwrap_or(serde_json::Value::Null),
    }
}

/// The resource of a codec's object, at `version` for a compare-and-swap.
fn dynamic(o: CrdObject, resource: &ApiResource, version: Option<Version>) -> DynamicObject {
    let mut d = DynamicObject::new(&o.name, resource).data(serde_json::json!({ "spec": o.spec }));
    d.metadata.labels = (!o.labels.is_empty()).then_some(o.labels);
    d.metadata.annotations = (!o.annotations.is_empty()).then_some(o.annotations);
    d.metadata.resource_version = version.map(|v| v.to_wire().to_string());
    d
}

impl Datastore for KubeStore {
    type Atomic = crate::contract::NoExtension;

    async fn get(&self, kind: Kind, name: &str) -> Result<Option<Object>> {
        if kind == crate::model::Node::kind() {
            return self.node_get(name).await;
        }
        if let Some(doc) = documents::native(kind) {
            return self.doc_get(doc, name).await;
        }
        let codec = self.codec(kind);
        let (api, _) = self.api(&*codec);
        let Some(found) = fetch(&api, &*codec, name).await? else {
            return Ok(None);
        };
        let version = version_of(found.metadata.resource_version.as_deref())?;
        Ok(codec
            .decode(&crd_object(&found))
            .map_err(codec_error)?
            .map(|(name, value)| Object {
                name,
                value,
                version,
            }))
    }

    async fn list(&self, kind: Kind, name_prefix: &str) -> Result<ObjectList> {
        if kind == crate::model::Node::kind() {
            return self.node_list(name_prefix).await;
        }
        if let Some(doc) = documents::native(kind) {
            return self.doc_list(doc, name_prefix).await;
        }
        let codec = self.codec(kind);
        let (api, _) = self.api(&*codec);
        let selector = codec.selector(name_prefix);
        list_objects(&api, selector, codec.plural(), name_prefix, |d, version| {
            let decoded = codec.decode(&crd_object(d)).map_err(|e| e.to_string())?;
            Ok(decoded.map(|(name, value)| Object {
                name,
                value,
                version,
            }))
        })
        .await
    }

    async fn create(&self, kind: Kind, name: &str, value: Vec<u8>) -> Result<Version> {
        if kind == crate::model::Node::kind() {
            return self.node_create(name, value).await;
        }
        if let Some(doc) = documents::native(kind) {
            return self.doc_write(doc, name, &value, None).await;
        }
        let codec = self.codec(kind);
        let (api, resource) = self.api(&*codec);
        let object = codec.encode(name, &value).map_err(codec_error)?;
        let object = dynamic(object, &resource, None);
        for _ in 0..2 {
            match api.create(&PostParams::default(), &object).await {
                Ok(d) => return version_of(d.metadata.resource_version.as_deref()),
                Err(e) if http_code(&e) == Some(409) => {
                    // A resource Calico marked deleted and did not delete (it stopped between
                    // the two): finish its deletion, as Calico's reads do, and create again.
                    if !self.finish_marked(&api, &*codec, name).await? {
                        return Err(self.conflict(&*codec, name, None).await);
                    }
                }
                Err(e) => return Err(request_error(e, &codec.resource_name(name))),
            }
        }
        Err(self.conflict(&*codec, name, None).await)
    }

    async fn update(
        &self,
        kind: Kind,
        name: &str,
        value: Vec<u8>,
        expected: Version,
    ) -> Result<Version> {
        if kind == crate::model::Node::kind() {
            return self.node_replace(name, Some(value), expected).await;
        }
        if let Some(doc) = documents::native(kind) {
            return self.doc_write(doc, name, &value, Some(expected)).await;
        }
        let codec = self.codec(kind);
        let (api, resource) = self.api(&*codec);
        let object = codec.encode(name, &value).map_err(codec_error)?;
        let resource_name = object.name.clone();
        let body = match codec.modelled_spec_fields() {
            None => dynamic(object, &resource, Some(expected)),
            // Calico's fields margay does not model, and the rest of the metadata, stay as
            // stored: the stored resource, at the version expected, with margay's fields
            // replaced (a replace of the whole would drop what Calico or a user wrote).
            Some(modelled) => {
                let Some(mut stored) = fetch(&api, &*codec, name).await? else {
                    return Err(self.conflict(&*codec, name, Some(expected)).await);
                };
                if version_of(stored.metadata.resource_version.as_deref())? != expected {
                    return Err(self.conflict(&*codec, name, Some(expected)).await);
                }
                let merged = keep_unmodelled(object, &crd_object(&stored), modelled);
                stored.metadata.labels = (!merged.labels.is_empty()).then_some(merged.labels);
                stored.metadata.annotations =
                    (!merged.annotations.is_empty()).then_some(merged.annotations);
                stored.data["spec"] = merged.spec;
                stored
            }
        };
        match api
            .replace(&resource_name, &PostParams::default(), &body)
            .await
        {
            Ok(d) => version_of(d.metadata.resource_version.as_deref()),
            Err(e) if matches!(http_code(&e), Some(404 | 409)) => {
                Err(self.conflict(&*codec, name, Some(expected)).await)
            }
            Err(e) => Err(request_error(e, &resource_name)),
        }
    }

    async fn delete(&self, kind: Kind, name: &str, expected: Version) -> Result<()> {
        if kind == crate::model::Node::kind() {
            return self.node_replace(name, None, expected).await.map(|_| ());
        }
        if let Some(doc) = documents::native(kind) {
            return self.doc_delete(doc, name, expected).await;
        }
        let codec = self.codec(kind);
        let (api, _) = self.api(&*codec);
        let resource_name = codec.resource_name(name);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(expected.to_wire().to_string()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&resource_name, &params).await {
            Ok(_) => Ok(()),
            Err(e) if matches!(http_code(&e), Some(404 | 409)) => {
                Err(self.conflict(&*codec, name, Some(expected)).await)
            }
            Err(e) => Err(request_error(e, &resource_name)),
        }
    }

    async fn watch(&self, kind: Kind, from: Version) -> Result<ObjectWatch> {
        if kind == crate::model::Node::kind() {
            return Ok(self.node_watch(from));
        }
        if let Some(doc) = documents::native(kind) {
            return Ok(self.doc_watch(doc, from));
        }
        let codec = self.codec(kind);
        let (api, _) = self.api(&*codec);
        let (tx, rx) = mpsc::channel(Watch::DEPTH);
        let selector = codec.selector("");
        let task = tokio::spawn(follow(api, selector, from, tx, move |d, deleted| {
            changed(&*codec, d, deleted)
        }));
        Ok(ObjectWatch::of_objects(rx, task))
    }

    fn atomic(&self) -> Option<&crate::contract::NoExtension> {
        None
    }

    fn describe(&self) -> String {
        self.inner.describe.clone()
    }
}

/// One kind's watch: the apiserver's watch of `api` (its resources matching `selector`)
/// from `from`, resumed from the last version seen (an event's or a bookmark's) each time the
/// server ends a request, until an error. `changed` turns a resource's change into margay's
/// event, if it is one.
pub(super) async fn follow<K>(
    api: Api<K>,
    selector: Option<String>,
    from: Version,
    tx: mpsc::Sender<Result<ObjectEvent>>,
    mut changed: impl FnMut(&K, bool) -> Result<Option<ObjectEvent>> + Send,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut last = from;
    let params = WatchParams {
        label_selector: selector,
        timeout: Some(WATCH_SECONDS),
        bookmarks: true,
        ..WatchParams::default()
    };
    loop {
        let stream = match api.watch(&params, &last.to_wire().to_string()).await {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Err(watch_error(e, last))).await;
                return;
            }
        };
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            let outcome = match item {
                Ok(WatchEvent::Added(d) | WatchEvent::Modified(d)) => {
                    passed(&mut last, &d);
                    changed(&d, false)
                }
                Ok(WatchEvent::Deleted(d)) => {
                    passed(&mut last, &d);
                    changed(&d, true)
                }
                Ok(WatchEvent::Bookmark(b)) => {
                    version_of(Some(&b.metadata.resource_version)).map(|v| {
                        last = v;
                        None
                    })
                }
                Ok(WatchEvent::Error(status)) => Err(status_error(&status, last)),
                Err(e) => Err(watch_error(e, last)),
            };
            match outcome {
                Ok(None) => {}
                Ok(Some(event)) => {
                    last = event.version;
                    if tx.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
    }
}

/// Moves the watch's resume point past a resource's change, also one that makes no event
/// (another kind's, a resource margay does not read): a quiet kind's watch does not fall
/// behind the history the apiserver keeps.
fn passed<K: kube::Resource>(last: &mut Version, d: &K) {
    if let Ok(v) = version_of(d.meta().resource_version.as_deref()) {
        *last = v;
    }
}

/// The event of a resource's change; `None` for a resource that is no object of margay's.
fn changed(codec: &dyn CrdCodec, d: &DynamicObject, deleted: bool) -> Result<Option<ObjectEvent>> {
    let version = version_of(d.metadata.resource_version.as_deref())?;
    let object = crd_object(d);
    let decoded = match codec.decode(&object) {
        Ok(decoded) => decoded,
        Err(e) => {
            tracing::warn!(error = %e, "a watched object margay cannot read is left out");
            return Ok(None);
        }
    };
    let (name, value) = match (decoded, deleted) {
        (Some((name, value)), false) => (name, Some(value)),
        (Some((name, _)), true) => (name, None),
        // Marked deleted by Calico (its mark, then its deletion): gone for margay.
        (None, _) => match name_of_marked(codec, &object) {
            Some(name) => (name, None),
            None => return Ok(None),
        },
    };
    Ok(Some(ObjectEvent {
        name,
        value,
        version,
    }))
}

/// margay's name of a resource Calico marked `deleted` (which decodes to no object): the
/// same resource decoded unmarked. The resource itself says it, whatever the watch saw of it
/// before (a watch may have only listed it, or begun after the mark).
fn name_of_marked(codec: &dyn CrdCodec, object: &CrdObject) -> Option<String> {
    let mut unmarked = object.clone();
    let deleted = unmarked.spec.get_mut("deleted")?;
    // BlockAffinity keeps it as a string, the others as a boolean.
    *deleted = if deleted.is_string() {
        serde_json::Value::from("false")
    } else {
        serde_json::Value::from(false)
    };
    codec.decode(&unmarked).ok()?.map(|(name, _)| name)
}

fn status_error(status: &kube::core::Status, last: Version) -> StoreError {
    if status.code == 410 {
        StoreError::TooOld {
            requested: format!("resourceVersion {last}"),
            oldest: format!("a newer one ({})", status.message),
        }
    } else {
        StoreError::Unavailable(format!(
            "the watch ended: {} ({} {})",
            status.message, status.code, status.reason
        ))
    }
}

fn watch_error(e: kube::Error, last: Version) -> StoreError {
    match e {
        kube::Error::Api(s) => status_error(&s, last),
        other => StoreError::Unavailable(format!("the watch ended: {other}")),
    }
}

/// margay's objects of the kinds Calico keeps nowhere, in margay's `MargayObject` CRD: the
/// resource's name is the kind's label and the object's name in lower-case base32 (any text
/// becomes a valid resource name), and a label per kind lets a list or watch ask the
/// apiserver for one kind only.
pub struct ObjectCodec {
    kind: Kind,
}

/// The label naming an object's kind.
const KIND_LABEL: &str = "margay.dev/kind";

impl ObjectCodec {
    pub fn new(kind: Kind) -> Self {
        ObjectCodec { kind }
    }

    /// The kind as a label value and a name part: its name in lower case (`-` for anything
    /// else, at most 30 characters) and a hash of its prefix, which is what tells kinds apart.
    fn kind_label(&self) -> String {
        use sha2::Digest;
        let name: String = self
            .kind
            .name
            .chars()
            .take(30)
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        let hash = sha2::Sha256::digest(self.kind.prefix.as_bytes());
        let hex: String = hash[..6].iter().map(|b| format!("{b:02x}")).collect();
        format!("{name}-{hex}")
    }
}

impl CrdCodec for ObjectCodec {
    fn kind(&self) -> Kind {
        self.kind
    }
    fn crd_kind(&self) -> &'static str {
        "MargayObject"
    }
    fn plural(&self) -> &'static str {
        "margayobjects"
    }
    fn group(&self) -> &'static str {
        MARGAY_GROUP
    }
    fn resource_name(&self, name: &str) -> String {
        use sha2::Digest;
        let base32 = |bytes: &[u8]| {
            data_encoding::BASE32HEX_NOPAD
                .encode(bytes)
                .to_ascii_lowercase()
        };
        // Base32 of "" is "": the `n` keeps the name non-empty and its parts DNS labels.
        let named = format!("{}.n{}", self.kind_label(), base32(name.as_bytes()));
        if named.len() <= 253 {
            return named;
        }
        // A long name by its hash (the object's own name is in its spec).
        format!(
            "{}.h{}",
            self.kind_label(),
            base32(&sha2::Sha256::digest(name.as_bytes()))
        )
    }
    fn encode(&self, name: &str, value: &[u8]) -> Result<CrdObject, CodecError> {
        let resource = self.resource_name(name);
        let (value, encoding) = match std::str::from_utf8(value) {
            Ok(text) => (text.to_owned(), "utf8"),
            Err(_) => (data_encoding::BASE64.encode(value), "base64"),
        };
        Ok(CrdObject {
            name: resource,
            labels: BTreeMap::from([(KIND_LABEL.to_owned(), self.kind_label())]),
            annotations: BTreeMap::new(),
            spec: serde_json::json!({
                "kind": self.kind.name,
                "name": name,
                "value": value,
                "encoding": encoding,
            }),
        })
    }
    fn decode(&self, object: &CrdObject) -> Result<Option<(String, Vec<u8>)>, CodecError> {
        let refuse = |reason: &str| CodecError {
            kind: self.kind.name,
            name: object.name.clone(),
            reason: reason.to_owned(),
        };
        let field = |f: &str| object.spec.get(f).and_then(serde_json::Value::as_str);
        let name = field("name").ok_or_else(|| refuse("spec.name is missing"))?;
        let value = field("value").ok_or_else(|| refuse("spec.value is missing"))?;
        let value = match field("encoding") {
            Some("base64") => data_encoding::BASE64
                .decode(value.as_bytes())
                .map_err(|e| refuse(&format!("spec.value is not base64: {e}")))?,
            _ => value.as_bytes().to_vec(),
        };
        Ok(Some((name.to_owned(), value)))
    }
    fn selector(&self, _name_prefix: &str) -> Option<String> {
        Some(format!("{KIND_LABEL}={}", self.kind_label()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THING: Kind = Kind::new("Workload Thing", "/margay/v1/things/");

    #[test]
    fn margay_objects_round_trip_with_any_name_and_value() {
        let codec = ObjectCodec::new(THING);
        for (name, value) in [
            ("node-1/10.0.0.0-26", br#"{"schema":1}"#.to_vec()),
            ("", Vec::new()),
            ("UPPER case:and/slashes", vec![0xff, 0x00, 0x80]),
        ] {
            let object = codec.encode(name, &value).unwrap();
            assert_eq!(object.name, codec.resource_name(name));
            assert!(
                object.name.len() <= 253
                    && object
                        .name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.".contains(c)),
                "{:?} is not a valid resource name",
                object.name
            );
            assert_eq!(
                codec.decode(&object).unwrap(),
                Some((name.to_owned(), value))
            );
        }
        assert_eq!(
            codec.selector("node-1/").as_deref(),
            Some(format!("margay.dev/kind={}", codec.kind_label()).as_str())
        );
        assert!(codec.kind_label().starts_with("workload-thing-"));
        assert_ne!(
            codec.kind_label(),
            ObjectCodec::new(Kind::new(THING.name, "/other/")).kind_label(),
            "kinds of one name and two prefixes are two kinds"
        );
    }

    #[test]
    fn a_name_too_long_to_spell_out_is_kept_by_its_hash() {
        let codec = ObjectCodec::new(THING);
        let (long, longer) = ("x".repeat(300), "x".repeat(301));
        let object = codec.encode(&long, b"{}").unwrap();
        assert!(object.name.len() <= 253, "{}", object.name);
        assert_ne!(object.name, codec.resource_name(&longer));
        assert_eq!(
            codec.decode(&object).unwrap(),
            Some((long.clone(), b"{}".to_vec()))
        );
    }

    #[test]
    fn resource_versions_must_be_numbers() {
        assert_eq!(version_of(Some("42")).unwrap(), Version::from_wire(42));
        let err = version_of(Some("abc")).unwrap_err();
        assert!(err.to_string().contains("etcd"), "{err}");
    }
}
