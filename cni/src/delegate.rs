//! Running a delegated plugin (an IPAM plugin other than margay's own, e.g. host-local) the way
//! the spec's section 4 says: found in CNI_PATH, run with the caller's environment except
//! CNI_COMMAND, fed the caller's whole configuration on stdin, its stderr passed through, its
//! stdout read as a result or a CNI error.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};

use serde_json::Value;

use crate::spec::env::Command;
use crate::spec::error::{CniError, code};
use crate::spec::result::CniResult;

/// Finds `plugin` in the CNI_PATH directories.
pub fn find(plugin: &str, path: &[PathBuf]) -> Result<PathBuf, CniError> {
    path.iter()
        .map(|dir| dir.join(plugin))
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            let dirs: Vec<String> = path.iter().map(|p| p.display().to_string()).collect();
            CniError::new(
                code::INVALID_CONFIG,
                format!(
                    "the IPAM plugin {plugin:?} is not in CNI_PATH ({})",
                    if dirs.is_empty() {
                        "unset".to_owned()
                    } else {
                        dirs.join(":")
                    }
                ),
            )
        })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs `plugin` with `command` and `stdin`. Ok(stdout) on success; the plugin's own CNI error
/// (or one describing how it failed) otherwise.
pub fn run(plugin: &Path, command: Command, stdin: &[u8]) -> Result<Vec<u8>, CniError> {
    let name = plugin.display().to_string();
    let mut child = Process::new(plugin)
        .env("CNI_COMMAND", command.as_str())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| CniError::new(code::DELEGATE, format!("cannot run {name}: {e}")))?;
    if let Some(mut input) = child.stdin.take() {
        // A plugin that exits without reading stdin closes the pipe: its exit status says
        // what happened, so a write error here is not the error to report.
        let _ = input.write_all(stdin);
    }
    let out = child
        .wait_with_output()
        .map_err(|e| CniError::new(code::DELEGATE, format!("waiting for {name}: {e}")))?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    let parsed = serde_json::from_slice::<Value>(&out.stdout)
        .ok()
        .and_then(|v| CniError::from_json(&v));
    Err(match parsed {
        Some(mut e) => {
            e.msg = format!("{name}: {}", e.msg);
            e
        }
        None => CniError::new(
            code::DELEGATE,
            format!(
                "{name} failed ({}) without a CNI error: {}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim()
            ),
        ),
    })
}

/// ADD through the delegate: its (IPAM) result.
pub fn add(plugin: &Path, stdin: &[u8]) -> Result<CniResult, CniError> {
    let out = run(plugin, Command::Add, stdin)?;
    let v: Value = serde_json::from_slice(&out).map_err(|e| {
        CniError::new(
            code::DECODE,
            format!("{} printed no JSON result: {e}", plugin.display()),
        )
    })?;
    CniResult::from_json(&v, &format!("the result of {}", plugin.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn finds_plugins_in_cni_path() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        script(b.path(), "ipam-x", "exit 0");
        std::fs::write(a.path().join("ipam-x"), "not executable").unwrap();
        let path = vec![a.path().to_owned(), b.path().to_owned()];
        assert_eq!(find("ipam-x", &path).unwrap(), b.path().join("ipam-x"));
        let e = find("nope", &path).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("nope") && e.msg.contains("CNI_PATH"));
        assert!(find("x", &[]).unwrap_err().msg.contains("unset"));
    }

    #[test]
    fn results_errors_and_crashes() {
        let d = tempfile::tempdir().unwrap();
        let ok = script(
            d.path(),
            "ok",
            r#"cat >/dev/null; [ "$CNI_COMMAND" = ADD ] || exit 3
echo '{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.5/24","gateway":"10.1.0.1"}]}'"#,
        );
        let r = add(&ok, b"{}").unwrap();
        assert_eq!(r.ips[0].address.to_string(), "10.1.0.5/24");

        let refuses = script(
            d.path(),
            "refuses",
            r#"echo '{"cniVersion":"1.0.0","code":7,"msg":"no subnet"}'; exit 1"#,
        );
        let e = add(&refuses, b"{}").unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("no subnet") && e.msg.contains("refuses"));

        let crashes = script(d.path(), "crashes", "echo garbage; exit 2");
        let e = run(&crashes, Command::Del, b"{}").unwrap_err();
        assert_eq!(e.code, code::DELEGATE);
        assert!(e.msg.contains("garbage"));

        let junk = script(d.path(), "junk", "echo not-json");
        assert_eq!(add(&junk, b"{}").unwrap_err().code, code::DECODE);
    }
}
