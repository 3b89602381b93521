//! Hostile input to the plugin's parsers, on the stable toolchain (the fuzz targets
//! `fuzz/fuzz_targets/cni_*` run the same oracle under libFuzzer): hand-picked nasties, and
//! seeded mutations of real configurations and environments. Every input must give a value
//! or an error object with the spec's code (`cni::spec::oracle`), never a panic; known bad
//! inputs must give the code the spec names. With `CNI_FUZZ_SEED_DIR` set (e.g. to
//! `fuzz/corpus`), the samples are written there as seeds for the fuzzers.

use cni::spec::{NetConf, code, oracle};
use serde_json::json;

/// The plugin's own entry of the shipped conflist, as the runtime hands it over.
fn sample_conf() -> Vec<u8> {
    let list: serde_json::Value =
        serde_json::from_str(include_str!("../../configs/10-margay.conflist")).unwrap();
    let mut conf = list["plugins"][0].clone();
    conf["name"] = list["name"].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    serde_json::to_vec(&conf).unwrap()
}

fn sample_confs() -> Vec<Vec<u8>> {
    let base = sample_conf();
    let mut dual: serde_json::Value = serde_json::from_slice(&base).unwrap();
    dual["ipam"]["assign_ipv6"] = json!("true");
    dual["ipam"]["ipv4_pools"] = json!(["default-ipv4"]);
    dual["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/32"}]});
    vec![
        base,
        serde_json::to_vec(&dual).unwrap(),
        br#"{"cniVersion":"0.4.0","name":"n","type":"margay","ipam":{"type":"host-local"}}"#
            .to_vec(),
    ]
}

fn sample_envs() -> Vec<Vec<u8>> {
    vec![
        b"CNI_COMMAND=ADD\nCNI_CONTAINERID=abc123\nCNI_NETNS=/var/run/netns/x\nCNI_IFNAME=eth0\n\
          CNI_ARGS=K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;IP=10.0.0.9\nCNI_PATH=/opt/cni/bin\n"
            .to_vec(),
        b"CNI_COMMAND=DEL\nCNI_CONTAINERID=abc123\nCNI_IFNAME=eth0\nCNI_PATH=/opt/cni/bin\n".to_vec(),
        b"CNI_COMMAND=VERSION\n".to_vec(),
        b"CNI_COMMAND=GC\nCNI_PATH=/opt/cni/bin\n".to_vec(),
    ]
}

/// xorshift64*: the same mutations on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One random edit of `input`: a flipped, inserted, deleted or duplicated run of bytes, or an
/// interesting byte or token put somewhere.
fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    const TOKENS: &[&[u8]] = &[
        b"\"",
        b"{",
        b"}",
        b"[",
        b"]",
        b":",
        b",",
        b"null",
        b"true",
        b"1e999",
        b"-0",
        b"\\u0000",
        b"\\ud800",
        b"\xff\xfe",
        b"\0",
        b"=",
        b";",
        b"\n",
        b"CNI_",
        b"9999999999999999999999",
    ];
    let mut v = input.to_vec();
    let at = rng.below(v.len() + 1);
    match rng.below(5) {
        0 if !v.is_empty() => {
            let i = rng.below(v.len());
            v[i] ^= 1 << rng.below(8);
        }
        1 => {
            let t = TOKENS[rng.below(TOKENS.len())];
            v.splice(at..at, t.iter().copied());
        }
        2 if !v.is_empty() => {
            let end = (at + rng.below(16)).min(v.len());
            v.drain(at.min(end)..end);
        }
        3 => {
            let start = rng.below(v.len() + 1);
            let end = (start + rng.below(64)).min(v.len());
            let run = v[start..end].to_vec();
            v.splice(at..at, run);
        }
        _ => v.truncate(at),
    }
    v
}

#[test]
fn mutated_configurations_and_environments_never_panic() {
    let mut rng = Rng(0x6d61_7267_6179_0001);
    let (confs, envs) = (sample_confs(), sample_envs());
    for c in &confs {
        let conf = NetConf::parse(c);
        assert!(conf.is_ok(), "a sample does not parse: {conf:?}");
        oracle::netconf(c);
    }
    for e in &envs {
        oracle::environment(e);
    }
    for round in 0..20_000 {
        // Edits stack up: most rounds start from an already-mutated input.
        let mut c = confs[round % confs.len()].clone();
        let mut e = envs[round % envs.len()].clone();
        for _ in 0..1 + rng.below(8) {
            c = mutate(&mut rng, &c);
            e = mutate(&mut rng, &e);
        }
        oracle::netconf(&c);
        oracle::environment(&e);
    }
    if let Some(dir) = std::env::var_os("CNI_FUZZ_SEED_DIR").map(std::path::PathBuf::from) {
        for (target, samples) in [("cni_netconf", &confs), ("cni_env", &envs)] {
            let d = dir.join(target);
            std::fs::create_dir_all(&d).unwrap();
            for (i, s) in samples.iter().enumerate() {
                std::fs::write(d.join(format!("sample-{i}")), s).unwrap();
            }
        }
    }
}

#[test]
fn known_bad_configurations_get_the_specs_codes() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let big = format!(
        r#"{{"cniVersion":"1.0.0","name":"n","type":"margay","mtu":"{}"}}"#,
        "n".repeat(1 << 20)
    );
    let cases: Vec<(&str, Vec<u8>, u32)> = vec![
        ("empty", b"".to_vec(), code::DECODE),
        ("not UTF-8", b"\xff\xfe{}".to_vec(), code::DECODE),
        ("nested past serde's limit", deep.into_bytes(), code::DECODE),
        ("a number", b"42".to_vec(), code::DECODE),
        (
            "cniVersion a number",
            br#"{"cniVersion":1,"name":"n","type":"margay"}"#.to_vec(),
            code::DECODE,
        ),
        (
            "an unknown version",
            br#"{"cniVersion":"9.9.9","name":"n","type":"margay"}"#.to_vec(),
            code::INCOMPATIBLE_VERSION,
        ),
        (
            "ipam a list",
            br#"{"cniVersion":"1.0.0","name":"n","type":"margay","ipam":[]}"#.to_vec(),
            code::DECODE,
        ),
        (
            "an mtu of a megabyte of text",
            big.into_bytes(),
            code::DECODE,
        ),
    ];
    for (what, stdin, want) in cases {
        oracle::netconf(&stdin);
        match NetConf::parse(&stdin) {
            Err(e) => assert_eq!(e.code, want, "{what}: {e:?}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }
}
