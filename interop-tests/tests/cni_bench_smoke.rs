//! cni-bench's smoke run, so the benchmark keeps working: every chain has a row for IPv4, IPv6
//! and dual-stack pods, 1 and 8 at a time, with positive figures, and the ratio lines of each
//! family are printed. The figures themselves are for the release build (see the README).

use std::process::Command;

use interop_tests::lab;

#[test]
fn cni_bench_smoke_prints_every_row() {
    let out = Command::new(lab::binary("cni-bench"))
        .arg("--smoke")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    for chain in [
        "margay + margay-ipam",
        "ptp + host-local",
        "ptp + margay-ipam",
    ] {
        for family in ["IPv4", "IPv6", "dual"] {
            for parallel in ["1", "8"] {
                let row = text
                    .lines()
                    .find(|l| {
                        let mut rest = l.strip_prefix(chain).unwrap_or("").split_whitespace();
                        l.starts_with(chain)
                            && rest.next() == Some(family)
                            && rest.next() == Some(parallel)
                    })
                    .unwrap_or_else(|| {
                        panic!("no row for {chain}, {family}, {parallel} at a time:\n{text}")
                    });
                let rate: f64 = row.split_whitespace().last().unwrap().parse().unwrap();
                assert!(rate > 0.0, "{row}");
                assert!(row.matches(" ms").count() == 4, "{row}");
            }
        }
    }
    for family in ["IPv4", "IPv6", "dual"] {
        for parallel in [1, 8] {
            assert!(
                text.contains(&format!(
                    "ratio margay / ptp+host-local, {family}, parallel {parallel}: ADD p50"
                )),
                "{text}"
            );
        }
    }
}
