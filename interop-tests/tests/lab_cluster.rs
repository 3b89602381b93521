//! The local cluster of the README's first command, end to end: `margay-lab up` on a lab of
//! this run's own name, every pod reaches every pod (same node, same subnet, other subnet over
//! VXLAN), `up` again is safe, `check` passes, `down` leaves nothing.

use std::process::Command;

use interop_tests::lab;

fn lab(name: &str, verb: &str) -> (bool, String) {
    let out = Command::new(lab::binary("margay-lab"))
        .arg(verb)
        .env("MARGAY_LAB_NAME", name)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Removes this run's lab even when an assertion fails.
struct Down(String);
impl Drop for Down {
    fn drop(&mut self) {
        let _ = lab(&self.0, "down");
    }
}

#[test]
fn up_check_up_again_down() {
    let name = format!("mlt{}", std::process::id());
    let _down = Down(name.clone());
    let (ok, text) = lab(&name, "up");
    println!("{text}");
    assert!(ok, "margay-lab up failed:\n{text}");
    assert!(text.contains("every pod answers every pod"), "{text}");
    assert_eq!(text.matches(" FAIL").count(), 0, "{text}");
    // Same subnet goes direct, the other subnet over VXLAN: both are in node-1's table.
    assert!(text.contains("dev vxlan.calico proto 80 onlink"), "{text}");
    assert!(text.contains("via 10.99.1.12 dev eth0 proto 80"), "{text}");
    assert!(text.contains("blackhole"), "{text}");

    let (ok, text) = lab(&name, "up");
    assert!(ok && text.contains("already up"), "{text}");
    let (ok, text) = lab(&name, "check");
    assert!(ok, "{text}");

    let (ok, text) = lab(&name, "down");
    assert!(ok, "{text}");
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = String::from_utf8_lossy(&left.stdout);
    assert!(
        !left.contains(&format!("{name}-")),
        "namespaces left: {left}"
    );
    assert!(!std::path::Path::new(&format!("/run/margay-lab-{name}")).exists());
}
