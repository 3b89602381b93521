//! bgp_bench's smoke run, so the benchmark keeps working: a tiny N, every receiver row present
//! with real numbers for both measures (ingest and advertisement to a collector), BIRD 2's
//! ratios 1.00 and bgpd's ingest resolution printed. The real run is `bgp_bench` (release
//! build); this checks the table, not the figures. Needs root and the peers installed.

use std::process::Command;

use interop_tests::lab;

#[test]
fn bgp_bench_smoke_prints_every_row() {
    let out = Command::new(lab::binary("bgp_bench"))
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
    for sets in ["1", "10"] {
        for receiver in ["bgpd", "BIRD 2", "BIRD 1.6", "FRR", "GoBGP"] {
            let row = text
                .lines()
                .find(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.first() == Some(&"2000")
                        && f.get(1) == Some(&sets)
                        && l.contains(&format!("  {receiver} "))
                })
                .unwrap_or_else(|| panic!("no row for {receiver} sets={sets}:\n{text}"));
            // ingest s, ±ms, CPU s, RSS MiB, B/rt, adv s, ±ms, 1st ms, advCPU, advRSS,
            // ×ingest, ×CPU, ×RSS, ×adv, ×aRSS
            let f: Vec<&str> = row
                .split_once(receiver)
                .unwrap()
                .1
                .split_whitespace()
                .collect();
            assert_eq!(f.len(), 15, "{row}");
            let num = |i: usize| -> f64 {
                f[i].parse()
                    .unwrap_or_else(|_| panic!("column {i} of {row}"))
            };
            assert!(num(0) > 0.0, "ingest time: {row}");
            assert!(num(1) >= 0.0, "ingest resolution: {row}");
            assert!(num(3) > 1.0, "peak RSS: {row}");
            assert!(num(4) >= 0.0, "bytes per route: {row}");
            assert!(num(5) > 0.0, "advertisement time: {row}");
            assert!(
                num(7) >= 0.0 && num(7) <= num(5) * 1000.0 + num(6) + 1.0,
                "first route: {row}"
            );
            assert!(num(9) > 1.0, "advertisement peak RSS: {row}");
            // CPU seconds of a tiny run may round to 0 (no ratio then: "-").
            assert!(f[11] == "-" || num(11) >= 0.0, "CPU ratio: {row}");
            for i in [10, 12, 13, 14] {
                let r = num(i);
                assert!(r > 0.0, "ratio column {i}: {row}");
                if receiver == "BIRD 2" {
                    assert!((r - 1.0).abs() < 1e-9, "BIRD 2 is the baseline: {row}");
                }
            }
        }
    }
}
