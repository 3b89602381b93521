//! The lab's network-namespace helper: per-run names, veth pairs, commands and code run
//! inside, and cleanup on drop, also when a test panics.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use interop_tests::lab::netns::{self, Netns, VethPair};

fn netns_inode() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino()
}

#[test]
fn names_carry_the_run_prefix_and_veth_pairs_connect() {
    let a = Netns::new("a").unwrap();
    let b = Netns::new("b").unwrap();
    assert_eq!(a.name(), format!("mgy{}-a", std::process::id()));
    assert!(a.path().exists());
    let _v = VethPair::new(&a, "ve-a", &b, "ve-b").unwrap();
    a.ip(&["addr", "add", "10.9.0.1/24", "dev", "ve-a"])
        .unwrap();
    b.ip(&["addr", "add", "10.9.0.2/24", "dev", "ve-b"])
        .unwrap();
    // Code inside b listens; code inside a connects.
    let l = b
        .run_in(|| TcpListener::bind("10.9.0.2:7000"))
        .unwrap()
        .unwrap();
    let c = a
        .run_in(|| {
            TcpStream::connect_timeout(&"10.9.0.2:7000".parse().unwrap(), Duration::from_secs(2))
        })
        .unwrap()
        .unwrap();
    let (_, peer) = l.accept().unwrap();
    assert_eq!(peer.ip(), Ipv4Addr::new(10, 9, 0, 1));
    drop(c);
    // Commands inside see the namespace's own links only.
    let links = a.exec("ip", &["-o", "link"]).unwrap();
    assert!(links.contains("ve-a") && !links.contains("ve-b"), "{links}");
    let e = a.ip(&["link", "add"]).unwrap_err();
    assert!(e.to_string().contains("ip -n"), "{e}");
}

#[test]
fn entering_returns_to_where_the_thread_was() {
    let a = Netns::new("enter").unwrap();
    let home = netns_inode();
    {
        let _g = a.enter().unwrap();
        assert_ne!(netns_inode(), home);
    }
    assert_eq!(netns_inode(), home);
    let inside = a.run_in(netns_inode).unwrap();
    assert_ne!(inside, home);
    assert_eq!(netns_inode(), home);
}

#[test]
fn drop_kills_what_runs_inside_and_removes_the_namespace() {
    let a = Netns::new("drop").unwrap();
    let path = a.path();
    let mut child = a.spawn(a.command("sleep").arg("600")).unwrap();
    let pid = child.pid();
    assert!(wait(|| a.pids().contains(&pid)));
    drop(a);
    assert!(!path.exists(), "namespace removed");
    assert!(wait(|| child.try_wait().is_some()), "process killed");
}

#[test]
fn a_panicking_test_still_cleans_up() {
    let name = format!("{}-boom", netns::run_prefix());
    let r = std::panic::catch_unwind(|| {
        let a = Netns::new("boom").unwrap();
        let b = Netns::new("boom2").unwrap();
        let _v = VethPair::new(&a, "x0", &b, "x1").unwrap();
        panic!("test failure");
    });
    assert!(r.is_err());
    assert!(!Path::new("/run/netns").join(&name).exists());
}

#[test]
fn stale_namespaces_of_dead_runs_are_removed() {
    // A name as a run with a PID that cannot exist would have left.
    let stale = "mgy4194304999-left";
    std::process::Command::new("ip")
        .args(["netns", "add", stale])
        .status()
        .unwrap();
    assert!(netns::remove_stale() >= 1);
    assert!(!Path::new("/run/netns").join(stale).exists());
    // Ours (this process is alive) stay.
    let a = Netns::new("alive").unwrap();
    netns::remove_stale();
    assert!(a.path().exists());
}

fn wait(mut f: impl FnMut() -> bool) -> bool {
    for _ in 0..200 {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}
