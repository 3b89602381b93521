//! bgp_bench's smoke run, so the benchmark keeps working: a tiny N, every receiver row present
//! with numbers. The real run is `bgp_bench` (release build); this checks the table, not the
//! figures. Needs root and the peers installed.

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
            let after = row.split_once(receiver).unwrap().1;
            let load: f64 = after.split_whitespace().next().unwrap().parse().unwrap();
            assert!(load > 0.0, "{row}");
        }
    }
}
