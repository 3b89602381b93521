//! The CustomResourceDefinitions of Calico's `crd.projectcalico.org/v1` kinds that margay
//! keeps in the Kubernetes datastore, one YAML file per kind under `datastore/crds/`, built
//! into the crate. The files are margay's own, written from Calico's documented resource
//! definitions and API types (field names, types, enums and ranges), not copies of Calico's
//! manifests; `scripts/check-crds` checks that their schemas are structural. [`ALL`] lists
//! every file with the names it must declare.

/// One CRD manifest: the names it declares and its YAML text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Manifest {
    /// `spec.names.plural`; the CRD is named `<plural>.crd.projectcalico.org`.
    pub plural: &'static str,
    /// `spec.names.kind` (singular is its lower case, listKind it plus `List`).
    pub kind: &'static str,
    /// `spec.scope` is `Namespaced` when true, `Cluster` when false.
    pub namespaced: bool,
    /// The whole manifest.
    pub yaml: &'static str,
}

macro_rules! manifest {
    ($plural:literal, $kind:literal, $namespaced:literal) => {
        Manifest {
            plural: $plural,
            kind: $kind,
            namespaced: $namespaced,
            yaml: include_str!(concat!("../../crds/", $plural, ".yaml")),
        }
    };
}

/// Every Calico kind margay keeps as a `crd.projectcalico.org/v1` custom resource.
pub const ALL: &[Manifest] = &[
    manifest!("ippools", "IPPool", false),
    manifest!("ipreservations", "IPReservation", false),
    manifest!("bgpconfigurations", "BGPConfiguration", false),
    manifest!("bgppeers", "BGPPeer", false),
    manifest!("bgpfilters", "BGPFilter", false),
    manifest!("ipamblocks", "IPAMBlock", false),
    manifest!("blockaffinities", "BlockAffinity", false),
    manifest!("ipamhandles", "IPAMHandle", false),
    manifest!("ipamconfigs", "IPAMConfig", false),
    manifest!("clusterinformations", "ClusterInformation", false),
    manifest!("felixconfigurations", "FelixConfiguration", false),
    manifest!("globalnetworkpolicies", "GlobalNetworkPolicy", false),
    manifest!("globalnetworksets", "GlobalNetworkSet", false),
    manifest!("hostendpoints", "HostEndpoint", false),
    manifest!("tiers", "Tier", false),
    manifest!(
        "kubecontrollersconfigurations",
        "KubeControllersConfiguration",
        false
    ),
    manifest!("networkpolicies", "NetworkPolicy", true),
    manifest!("networksets", "NetworkSet", true),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::{ALL, Manifest};
    use crate::crd::{GROUP, VERSION};

    fn parse(m: &Manifest) -> Value {
        serde_saphyr::from_str::<Value>(m.yaml)
            .unwrap_or_else(|e| panic!("{}.yaml does not parse: {e}", m.plural))
    }

    fn text<'a>(doc: &'a Value, pointer: &str) -> &'a str {
        doc.pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("<missing>")
    }

    /// The paths of the schema nodes the apiserver would call non-structural for want of a
    /// type (int-or-string and preserve-unknown-fields nodes need none).
    fn untyped(node: &Value, path: &str, out: &mut Vec<String>) {
        let Some(obj) = node.as_object() else {
            out.push(format!("{path} (not a schema)"));
            return;
        };
        let exempt = [
            "x-kubernetes-int-or-string",
            "x-kubernetes-preserve-unknown-fields",
        ]
        .iter()
        .any(|k| obj.get(*k) == Some(&Value::Bool(true)));
        if !obj.get("type").is_some_and(Value::is_string) && !exempt {
            out.push(path.to_string());
        }
        if let Some(props) = obj.get("properties").and_then(Value::as_object) {
            for (name, child) in props {
                untyped(child, &format!("{path}.{name}"), out);
            }
        }
        if let Some(extra) = obj.get("additionalProperties").filter(|v| v.is_object()) {
            untyped(extra, &format!("{path}.*"), out);
        }
        if obj.get("type").and_then(Value::as_str) == Some("array") {
            match obj.get("items") {
                Some(items) => untyped(items, &format!("{path}[]"), out),
                None => out.push(format!("{path} (array without items)")),
            }
        }
    }

    #[test]
    fn every_manifest_declares_the_names_all_gives_it() {
        for m in ALL {
            let doc = parse(m);
            let file = format!("{}.yaml", m.plural);
            assert_eq!(
                text(&doc, "/apiVersion"),
                "apiextensions.k8s.io/v1",
                "{file}"
            );
            assert_eq!(text(&doc, "/kind"), "CustomResourceDefinition", "{file}");
            assert_eq!(
                text(&doc, "/metadata/name"),
                format!("{}.{GROUP}", m.plural),
                "{file}"
            );
            assert_eq!(text(&doc, "/spec/group"), GROUP, "{file}");
            assert_eq!(text(&doc, "/spec/names/plural"), m.plural, "{file}");
            assert_eq!(text(&doc, "/spec/names/kind"), m.kind, "{file}");
            assert_eq!(
                text(&doc, "/spec/names/singular"),
                m.kind.to_lowercase(),
                "{file}"
            );
            assert_eq!(
                text(&doc, "/spec/names/listKind"),
                format!("{}List", m.kind),
                "{file}"
            );
            assert!(
                doc.pointer("/spec/names/shortNames").is_none(),
                "{file}: short names"
            );
            let scope = if m.namespaced {
                "Namespaced"
            } else {
                "Cluster"
            };
            assert_eq!(text(&doc, "/spec/scope"), scope, "{file}");

            let versions = doc.pointer("/spec/versions").and_then(Value::as_array);
            let versions = versions.unwrap_or_else(|| panic!("{file}: no versions"));
            assert_eq!(versions.len(), 1, "{file}: one version");
            let v = &versions[0];
            assert_eq!(text(v, "/name"), VERSION, "{file}");
            assert_eq!(v.get("served"), Some(&Value::Bool(true)), "{file}: served");
            assert_eq!(v.get("storage"), Some(&Value::Bool(true)), "{file}: stored");
            let schema = v.pointer("/schema/openAPIV3Schema");
            let schema = schema.unwrap_or_else(|| panic!("{file}: no schema"));
            assert_eq!(text(schema, "/type"), "object", "{file}: root type");
            assert_eq!(
                text(schema, "/properties/spec/type"),
                "object",
                "{file}: spec type"
            );
            let mut bad = Vec::new();
            untyped(schema, "openAPIV3Schema", &mut bad);
            assert!(bad.is_empty(), "{file}: untyped schema nodes {bad:?}");
        }
    }

    #[test]
    fn all_lists_the_eighteen_kinds_once_each() {
        let expected: BTreeSet<(&str, &str, bool)> = [
            ("ippools", "IPPool", false),
            ("ipreservations", "IPReservation", false),
            ("bgpconfigurations", "BGPConfiguration", false),
            ("bgppeers", "BGPPeer", false),
            ("bgpfilters", "BGPFilter", false),
            ("ipamblocks", "IPAMBlock", false),
            ("blockaffinities", "BlockAffinity", false),
            ("ipamhandles", "IPAMHandle", false),
            ("ipamconfigs", "IPAMConfig", false),
            ("clusterinformations", "ClusterInformation", false),
            ("felixconfigurations", "FelixConfiguration", false),
            ("globalnetworkpolicies", "GlobalNetworkPolicy", false),
            ("globalnetworksets", "GlobalNetworkSet", false),
            ("hostendpoints", "HostEndpoint", false),
            ("tiers", "Tier", false),
            (
                "kubecontrollersconfigurations",
                "KubeControllersConfiguration",
                false,
            ),
            ("networkpolicies", "NetworkPolicy", true),
            ("networksets", "NetworkSet", true),
        ]
        .into_iter()
        .collect();
        assert_eq!(expected.len(), 18);
        assert_eq!(ALL.len(), 18, "ALL has {} entries", ALL.len());
        let plurals: BTreeSet<_> = ALL.iter().map(|m| m.plural).collect();
        let kinds: BTreeSet<_> = ALL.iter().map(|m| m.kind).collect();
        assert_eq!(plurals.len(), ALL.len(), "a plural is listed twice");
        assert_eq!(kinds.len(), ALL.len(), "a kind is listed twice");
        let listed: BTreeSet<_> = ALL
            .iter()
            .map(|m| (m.plural, m.kind, m.namespaced))
            .collect();
        assert_eq!(listed, expected);
    }

    #[test]
    fn every_calico_crd_file_is_listed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
        let mut files = BTreeSet::new();
        for entry in std::fs::read_dir(&dir).expect("datastore/crds") {
            let name = entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned();
            if let Some(plural) = name.strip_suffix(".yaml") {
                files.insert(plural.to_string());
            }
        }
        let listed: BTreeSet<_> = ALL.iter().map(|m| m.plural.to_string()).collect();
        assert_eq!(files, listed, "datastore/crds/*.yaml and ALL differ");
    }
}
