//! policy-bench's smoke run, so the benchmark keeps working: a small lab run prints every
//! figure (apply → in force, routewriter's CPU and memory, the packet path in three modes)
//! with sane values, and each packet-path mode is what it says (the port no policy allows is
//! dropped with margay's policies and with the iptables rules, answered with none). The
//! figures themselves are for the release build at full size (see the README).

use std::process::Command;

use interop_tests::lab;

/// The numbers of a line, in order ("1.23 ms" gives 1.23).
fn numbers(line: &str) -> Vec<f64> {
    line.split(|c: char| c.is_whitespace() || c == ',' || c == ';' || c == '(' || c == ')')
        .filter_map(|w| w.parse::<f64>().ok())
        .collect()
}

fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{text}"))
}

#[test]
fn policy_bench_smoke_prints_every_figure() {
    let started = std::time::Instant::now();
    let out = Command::new(lab::binary("policy-bench"))
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

    // apply -> in force: p50 <= p99 <= max, in milliseconds, within the bench's own limit;
    // every node's time is at least node-1's (it is the latest of the four).
    let mut p50s = Vec::new();
    for row in [
        "Policy.Apply returned",
        "rule in node-1's kernel",
        "rule in every node's kernel (4)",
    ] {
        let l = line(&text, row);
        assert_eq!(l.matches(" ms").count(), 3, "{l}");
        let n = numbers(l);
        let (p50, p99, max) = (n[n.len() - 3], n[n.len() - 2], n[n.len() - 1]);
        assert!(
            p50 > 0.0 && p50 <= p99 && p99 <= max && max < 15_000.0,
            "{l}"
        );
        p50s.push(p50);
    }
    assert!(p50s[2] >= p50s[1], "every node before node-1?\n{text}");
    let res = line(&text, "resolution: nft monitor's line");
    assert_eq!(res.matches(" ms").count(), 2, "{res}");
    let s = line(&text, "== apply -> in force on every node: p50");
    assert!(s.contains("target p99 <= 200 ms: "), "{s}");

    // routewriter: CPU used by the load, memory held.
    let rw = line(&text, "== routewriter node-1 with");
    let n = numbers(rw);
    let (rss, load_cpu) = (n[1], n[2]);
    assert!(rss > 1.0 && rss < 1024.0, "{rw}");
    assert!(load_cpu > 0.0, "{rw}");
    let load = line(&text, "load: applied in");
    let chains = numbers(load)[2];
    assert!(chains >= 10.0, "node-1 has few endpoint chains: {load}");

    // The packet path: three modes, positive figures, each mode enforced as it says.
    for (mode, denied) in [
        ("(a) no policy", "answers"),
        ("(b) margay,", "dropped"),
        ("(c) iptables,", "dropped"),
    ] {
        let l = line(&text, mode);
        let w: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(w.last(), Some(&denied), "{l}");
        // ... Gbit/s, connections/s, both over (a), SYN retransmits, denied.
        let n = numbers(l);
        let (gbit, rate, tput_a, conn_a, rtx) = (
            n[n.len() - 5],
            n[n.len() - 4],
            n[n.len() - 3],
            n[n.len() - 2],
            n[n.len() - 1],
        );
        assert!(gbit > 0.0 && rate > 0.0, "{l}");
        assert!(rtx >= 0.0 && rtx.fract() == 0.0, "{l}");
        assert!(tput_a > 0.0 && conn_a > 0.0, "{l}");
        if mode.starts_with("(a)") {
            assert_eq!((tput_a, conn_a), (1.0, 1.0), "{l}");
        }
    }
    let r = line(&text, "== packet path b/a: throughput");
    // b/a and c/a, throughput and connections/s each (the target's 0.90: is not a number).
    assert_eq!(numbers(r).len(), 4, "{r}");
    assert!(numbers(r).iter().all(|x| *x > 0.0), "{r}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(90),
        "the smoke run took {:?}",
        started.elapsed()
    );
}
