//! Each benchmark's smoke run, so the benchmarks keep working. The real runs are commands of
//! their own (see the README); these use tiny sizes and check the table, not the figures.

use std::process::Command;

use interop_tests::lab;

#[test]
fn store_bench_smoke_prints_every_row() {
    let out = Command::new(lab::binary("store-bench"))
        .args(["bench", "--smoke"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    for backend in [
        "sqlite (sync=full)",
        "sqlite (sync=normal)",
        "etcd (1 member)",
    ] {
        for writers in [1, 8] {
            let row = text
                .lines()
                .find(|l| {
                    l.starts_with(backend)
                        && l.split_whitespace().rev().nth(2) == Some(&writers.to_string())
                })
                .unwrap_or_else(|| panic!("no row for {backend} with {writers} writers:\n{text}"));
            let rate: f64 = row.split_whitespace().last().unwrap().parse().unwrap();
            assert!(rate > 0.0, "{row}");
        }
    }
    for watcher in ["sqlite, same process", "sqlite, other process", "etcd"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(watcher) && l.ends_with("ms")),
            "no latency row for {watcher}:\n{text}"
        );
    }
}

#[test]
fn ipam_bench_smoke_prints_every_row() {
    let out = Command::new(lab::binary("ipam-bench"))
        .args(["bench", "--smoke"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    for backend in ["sqlite (sync=full)", "etcd (1 member)"] {
        for clients in ["1", "8"] {
            let row = text
                .lines()
                .find(|l| {
                    l.starts_with(backend)
                        && l[backend.len()..].split_whitespace().next() == Some(clients)
                })
                .unwrap_or_else(|| panic!("no row for {backend} with {clients} clients:\n{text}"));
            let allocs: f64 = row[backend.len()..]
                .split_whitespace()
                .nth(1)
                .unwrap()
                .parse()
                .unwrap();
            assert!(allocs > 0.0, "{row}");
        }
    }
    assert!(text.contains("200 pods"), "{text}");
}
