//! route_bench's smoke run, so the benchmark keeps working: a tiny N, every row of both
//! families present and every figure a number. The real run is `route_bench` (release build);
//! this checks the table, not the figures.

use std::process::Command;

use interop_tests::lab;

#[test]
fn route_bench_smoke_prints_every_row() {
    let out = Command::new(lab::binary("route_bench"))
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
    for method in [
        "routewriter (batched netlink)",
        "ip -batch",
        "ip -batch + nexthop objects",
        "routewriter -6 (batched netlink)",
        "ip -6 -batch",
        "ip -6 -batch + nexthop objects",
    ] {
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.trim_start().starts_with("500")
                    && !l.contains("targets")
                    && l.contains(method)
                    && !l.contains(&format!("{method} +"))
            })
            .collect();
        assert_eq!(rows.len(), 1, "one row for {method}:\n{text}");
        let row = rows[0];
        let rest = row.split_once(method).unwrap().1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let rate: f64 = fields[1].parse().unwrap_or_else(|_| panic!("{row}"));
        assert!(rate > 0.0, "{row}");
        let share: f64 = fields[4]
            .trim_end_matches('%')
            .parse()
            .unwrap_or_else(|_| panic!("{row}"));
        assert!(share > 0.0, "{row}");
    }
    for (family, baseline) in [("IPv4", "ip -batch"), ("IPv6", "ip -6 -batch")] {
        let targets = text
            .lines()
            .find(|l| l.contains(&format!("targets {family}:")))
            .unwrap_or_else(|| panic!("a targets line for {family}:\n{text}"));
        assert!(
            targets.contains(&format!("bulk >= 2.0x {baseline}:"))
                && targets.contains("B/route held"),
            "{targets}"
        );
    }
    for method in ["routewriter (batched", "routewriter -6 (batched"] {
        let rw = text.lines().find(|l| l.contains(method)).unwrap();
        let held: f64 = rw.split_whitespace().rev().nth(1).unwrap().parse().unwrap();
        assert!(held > 0.0 && held < 200.0, "{rw}");
    }
}
