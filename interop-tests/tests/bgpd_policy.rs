//! The `Policy` service of a real bgpd: documents checked before they are stored (a refusal
//! names the field and stores nothing), stored as written with the namespace and node filled
//! in, labels changed in place (and refused when they are not labels), `Explain`, and margay's
//! GC removing the endpoints whose addresses it released.

use interop_tests::lab::bgpd::{Daemon, runtime};
use proto::v1 as pb;
use proto::v1::ipam_client::IpamClient;
use proto::v1::policy_client::PolicyClient;
use serde_json::{Value, json};
use tonic::Code;

const PLAIN_POOL: &str =
    "[[ipam.default_pools]]\nname = \"default-ipv4-ippool\"\ncidr = \"172.20.0.0/16\"\n";

fn wep(name: &str, addr: &str, app: &str) -> Value {
    json!({
        "apiVersion": "projectcalico.org/v3", "kind": "WorkloadEndpoint",
        "metadata": {"name": name, "namespace": "prod", "labels": {"app": app}},
        "spec": {"pod": name, "interfaceName": format!("cali{name}"), "ipNetworks": [addr]}
    })
}

fn list_req(kind: pb::DocumentKind) -> pb::ListDocumentsRequest {
    pb::ListDocumentsRequest {
        kind: kind as i32,
        ..Default::default()
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: refuse, store, explain, label, GC, delete documents through the API; each step reads what the last one stored"
)]
fn documents_labels_explain_and_gc_through_the_api() {
    let d = Daemon::start(PLAIN_POOL);
    runtime().block_on(async {
        let ch = proto::client::connect_unix(&d.socket).await.unwrap();
        let mut p = PolicyClient::new(ch.clone());
        let apply = |v: &Value| pb::ApplyDocumentRequest {
            json: v.to_string(),
        };

        // Refusals name the field; nothing is stored.
        let bad = json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "np", "namespace": "prod"},
            "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 70000}]}]}
        });
        let e = p.apply(apply(&bad)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        assert!(e.message().contains("spec.ingress[0].ports[0].port"), "{e}");
        let e = p
            .apply(pb::ApplyDocumentRequest { json: "{".into() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        let stored = p
            .list(list_req(pb::DocumentKind::K8sNetworkPolicy))
            .await
            .unwrap()
            .into_inner();
        assert!(stored.documents.is_empty());

        // A good policy is stored as written; the endpoints get this bgpd's node.
        let mut good = bad.clone();
        good["spec"]["ingress"][0]["ports"][0]["port"] = json!(80);
        good["spec"]["podSelector"] = json!({"matchLabels": {"app": "web"}});
        good["metadata"]["uid"] = json!("read-only, not stored");
        let r = p.apply(apply(&good)).await.unwrap().into_inner();
        assert!(r.created);
        let r = p.apply(apply(&good)).await.unwrap().into_inner();
        assert!(!r.created, "applied again: replaced");

        let mut ipam = IpamClient::new(ch.clone());
        let a = ipam
            .auto_assign(pb::AutoAssignRequest {
                handle: "net.web".into(),
                num_ipv4: 1,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let web_addr = a.ipv4[0].address.clone();
        p.apply(apply(&wep("web", &web_addr, "web"))).await.unwrap();
        // An endpoint whose address is no longer allocated (its pod never got DEL).
        p.apply(apply(&wep("ghost", "172.20.200.9/32", "web")))
            .await
            .unwrap();
        let weps = p
            .list(list_req(pb::DocumentKind::WorkloadEndpoint))
            .await
            .unwrap()
            .into_inner()
            .documents;
        assert_eq!(weps.len(), 2);
        let doc: Value = serde_json::from_str(&weps[1].json).unwrap();
        assert_eq!(doc["spec"]["node"], "test-node", "{doc}");
        let np: Value = serde_json::from_str(
            &p.list(list_req(pb::DocumentKind::K8sNetworkPolicy))
                .await
                .unwrap()
                .into_inner()
                .documents[0]
                .json,
        )
        .unwrap();
        assert!(np["metadata"].get("uid").is_none(), "{np}");

        // Explain, by pod name.
        let x = p
            .explain(pb::ExplainRequest {
                namespace: "prod".into(),
                endpoint: "web".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(x.text.contains("k8s-networkpolicy/prod/np"), "{}", x.text);
        assert!(x.text.contains("ingress: deny"), "{}", x.text);
        let e = p
            .explain(pb::ExplainRequest {
                namespace: "prod".into(),
                endpoint: "nobody".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);

        // Labels: set, removed; one that is not a label is refused and changes nothing.
        let wref = pb::DocumentRef {
            kind: pb::DocumentKind::WorkloadEndpoint as i32,
            namespace: "prod".into(),
            name: "web".into(),
        };
        p.label(pb::LabelRequest {
            r#ref: Some(wref.clone()),
            set: [("tier".to_owned(), "front".to_owned())].into(),
            remove: vec!["app".into()],
        })
        .await
        .unwrap();
        let x = p
            .explain(pb::ExplainRequest {
                namespace: "prod".into(),
                endpoint: "web".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(
            x.text.contains("ingress: allow"),
            "no longer selected: {}",
            x.text
        );
        let e = p
            .label(pb::LabelRequest {
                r#ref: Some(wref.clone()),
                set: [("bad key!".to_owned(), "x".to_owned())].into(),
                remove: vec![],
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        let e = p
            .label(pb::LabelRequest {
                r#ref: Some(pb::DocumentRef {
                    kind: pb::DocumentKind::K8sNetworkPolicy as i32,
                    namespace: "prod".into(),
                    name: "np".into(),
                }),
                set: [("a".to_owned(), "b".to_owned())].into(),
                remove: vec![],
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");

        // GC removes the endpoint without allocated addresses, keeps the live one.
        ipam.garbage_collect(pb::GarbageCollectRequest {
            live_handles: vec!["net.web".into()],
            handle_prefix: "net.".into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let names: Vec<String> = p
            .list(list_req(pb::DocumentKind::WorkloadEndpoint))
            .await
            .unwrap()
            .into_inner()
            .documents
            .into_iter()
            .map(|d| d.r#ref.unwrap().name)
            .collect();
        assert_eq!(names, vec!["web"]);

        // Delete: gone, and a second time NOT_FOUND.
        let nref = pb::DocumentRef {
            kind: pb::DocumentKind::K8sNetworkPolicy as i32,
            namespace: "prod".into(),
            name: "np".into(),
        };
        p.delete(nref.clone()).await.unwrap();
        assert_eq!(p.delete(nref).await.unwrap_err().code(), Code::NotFound);
    });
}
