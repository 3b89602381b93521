//! scale_bench's smoke run, so the benchmark keeps working: a three-node mesh per
//! implementation, idle 2 s. It checks that each row is there with numbers and that the mesh
//! converged (the bench fails otherwise), not the figures; the real run is `scale_bench`
//! (release build). Needs root, BIRD 1.6 and bgpd built.

use std::process::Command;

use interop_tests::lab;

/// The implementations whose rows must be present.
const IMPLS: [(&str, &str); 2] = [("bird16", "BIRD1.6"), ("bgpd", "bgpd")];

#[test]
fn scale_bench_smoke_converges_with_every_implementation() {
    let impls: Vec<&str> = IMPLS.iter().map(|(arg, _)| *arg).collect();
    let out = Command::new(lab::binary("scale_bench"))
        .args([
            "--n",
            "3",
            "--idle-secs",
            "2",
            "--settle-secs",
            "1",
            "--timeout-s",
            "30",
        ])
        .args(["--impl", &impls.join(",")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{err}");
    println!("{text}");
    for (_, name) in IMPLS {
        let row: Vec<&str> = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.first() == Some(&"3") && f.get(1) == Some(&name))
            .unwrap_or_else(|| panic!("no row for {name}:\n{text}\n{err}"));
        // converge s, CPU s, RSS MiB/node, anon, idle CPU %/node, idle RSS
        let values: Vec<f64> = row[2..8]
            .iter()
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{name}: {v:?} is not a number: {row:?}"))
            })
            .collect();
        assert!(values[0] > 0.0, "{name} did not converge: {row:?}");
        assert!(values[2] > 0.0, "{name} has no resident memory: {row:?}");
        assert!(
            values[3] > 0.0 && values[3] < values[2],
            "{name}: anonymous memory is part of the resident: {row:?}"
        );
        assert!(
            values[5] > 0.0,
            "{name} has no resident memory idle: {row:?}"
        );
    }
}
