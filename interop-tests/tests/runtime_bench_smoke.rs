//! runtime-bench's smoke run (10 sandboxes at once), so the benchmark keeps working: both
//! chains' rows, margay's own ADD line and the ratio line are printed, and nothing is left
//! allocated (the bench fails otherwise). The figures are for the release build (README).

use std::process::Command;

use interop_tests::lab;

#[test]
fn runtime_bench_smoke_prints_both_chains_and_the_ratio() {
    let out = Command::new(lab::binary("runtime-bench"))
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
    for row in ["ptp+host-local   ", "margay           ", "margay's own ADD"] {
        assert!(
            text.lines().any(|l| l.starts_with(row)),
            "no row {row:?}:\n{text}"
        );
    }
    let ratio = text
        .lines()
        .find(|l| l.starts_with("== 10 sandboxes at once"))
        .unwrap_or_else(|| panic!("no ratio line:\n{text}"));
    let x: f64 = ratio
        .split("= x")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no ratio in {ratio:?}"));
    assert!(x > 0.0, "{ratio}");
}
