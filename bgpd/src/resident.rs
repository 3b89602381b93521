//! Gives the kernel back the memory a running bgpd no longer uses, once start-up is over:
//! the pages of its own code and read-only data that only start-up touched, and the free
//! pages the C library's allocator keeps.
//!
//! **Why.** A node's resident memory is mostly bgpd's code: configuration, SQLite's schema,
//! the gRPC and HTTP stacks, the registration run once, and the kernel maps a 64 KiB window
//! around every page of code that runs (fault-around). Those pages stay mapped for the
//! process's life although most are never run again. Unmapping them (`MADV_DONTNEED`) costs
//! nothing that matters: they stay in the page cache, and code that runs again is mapped
//! again at its next call (a minor fault), so what stays resident is what the node runs.
//!
//! **Boundaries.** Only mappings of the bgpd executable that are not writable and hold no
//! private (anonymous) page are released: for those the file's content is the memory's
//! content, so nothing is lost. The relocated read-only data (written at start, then
//! protected) holds private pages and is left alone, as is all writable memory. Everything
//! here is advice: on failure the pages simply stay.

use std::time::Duration;

use tokio::sync::watch;

/// One mapping of `/proc/self/smaps`: what [`releasable`] decides on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: usize,
    pub end: usize,
    pub perms: String,
    pub path: String,
    /// Private (copy-on-write or anonymous) memory in the mapping, in KiB.
    pub anonymous_kib: u64,
    pub rss_kib: u64,
}

/// The mappings of an smaps text (`/proc/PID/smaps`); lines it does not know are skipped.
pub fn parse_smaps(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((start, end)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            )
        {
            // start-end perms offset dev inode [path]
            let perms = fields.next().unwrap_or_default().to_owned();
            let path = fields.nth(3).map(str::to_owned).unwrap_or_default();
            out.push(Mapping {
                start,
                end,
                perms,
                path,
                anonymous_kib: 0,
                rss_kib: 0,
            });
            continue;
        }
        let (Some(last), Some(kib)) = (
            out.last_mut(),
            fields.next().and_then(|v| v.parse::<u64>().ok()),
        ) else {
            continue;
        };
        match first {
            "Anonymous:" => last.anonymous_kib = kib,
            "Rss:" => last.rss_kib = kib,
            _ => {}
        }
    }
    out
}

/// The mappings of `exe` whose pages can be dropped and read back from the file: not
/// writable, private, and without a page of their own.
pub fn releasable<'a>(maps: &'a [Mapping], exe: &'a str) -> impl Iterator<Item = &'a Mapping> {
    maps.iter().filter(move |m| {
        m.path == exe
            && m.perms.starts_with('r')
            && !m.perms.contains('w')
            && m.perms.ends_with('p')
            && m.anonymous_kib == 0
    })
}

/// Unmaps the releasable pages of this executable (see the module's boundaries) and returns
/// the resident KiB they held.
pub fn release_code_pages() -> std::io::Result<u64> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let maps = parse_smaps(&std::fs::read_to_string("/proc/self/smaps")?);
    let mut released = 0;
    for m in releasable(&maps, &exe.to_string_lossy()) {
        // SAFETY: the range is a whole mapping of the executable file that nothing writes
        // and that holds no private page, so dropping its pages loses no content: the next
        // access reads the same bytes back from the file.
        let rc = unsafe {
            libc::madvise(
                m.start as *mut libc::c_void,
                m.end - m.start,
                libc::MADV_DONTNEED,
            )
        };
        if rc == 0 {
            released += m.rss_kib;
        }
    }
    Ok(released)
}

/// Returns the allocator's free pages to the kernel (the C library keeps freed memory in its
/// arenas; only its top is returned by itself).
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists, under its locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How long after start-up is over the pages are released: time for the node's sessions to
/// come up and exchange their routes, so that what is mapped again afterwards is what a
/// running node runs. (Released at once, most of the code came back while the sessions
/// started: it lies among the start-up code, see `scripts/code-order`.)
pub const SETTLE: Duration = Duration::from_secs(5);

/// Waits until start-up is over (`started`: the first cluster state this node applied) and
/// [`SETTLE`] more, then gives back what start-up alone used.
pub async fn run(mut started: watch::Receiver<bool>) {
    if started.wait_for(|s| *s).await.is_err() {
        return;
    }
    tokio::time::sleep(SETTLE).await;
    trim_heap();
    match release_code_pages() {
        Ok(kib) => tracing::info!(kib, "start-up's code pages released"),
        Err(e) => tracing::info!(error = %e, "start-up's code pages kept"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0c0000000-55d0c01c4000 r--p 00000000 fe:00 5310478                    /opt/bgpd
Size:               1808 kB
Rss:                 704 kB
Anonymous:             0 kB
55d0c01c4000-55d0c0908000 r-xp 001c3000 fe:00 5310478                    /opt/bgpd
Rss:                2384 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me
55d0c0908000-55d0c0937000 r--p 00906000 fe:00 5310478                    /opt/bgpd
Rss:                 188 kB
Anonymous:           188 kB
55d0c0937000-55d0c0941000 rw-p 00934000 fe:00 5310478                    /opt/bgpd
Rss:                  40 kB
Anonymous:            12 kB
55d0c1000000-55d0c1100000 rw-p 00000000 00:00 0                          [heap]
Rss:                 468 kB
Anonymous:           468 kB
7f0000000000-7f0000010000 r--s 00000000 fe:00 42                         /tmp/store.db-shm
Rss:                  32 kB
Anonymous:             0 kB
7f0000100000-7f0000200000 r-xp 00000000 fe:00 43                         /usr/lib/libother.so
Rss:                  64 kB
Anonymous:             0 kB
7f0000300000-7f0000301000 rw-p 00000000 00:00 0 
Rss:                   4 kB
Anonymous:             4 kB
";

    #[test]
    fn smaps_are_read_mapping_by_mapping() {
        let maps = parse_smaps(SMAPS);
        assert_eq!(maps.len(), 8);
        assert_eq!(maps[1].start, 0x55d0c01c4000);
        assert_eq!(maps[1].end, 0x55d0c0908000);
        assert_eq!(maps[1].perms, "r-xp");
        assert_eq!(maps[1].path, "/opt/bgpd");
        assert_eq!((maps[1].rss_kib, maps[1].anonymous_kib), (2384, 0));
        assert_eq!((maps[2].rss_kib, maps[2].anonymous_kib), (188, 188));
        assert_eq!(maps[4].path, "[heap]");
        assert_eq!(maps[7].path, "");
        assert_eq!(maps[7].anonymous_kib, 4);
    }

    #[test]
    fn only_the_executables_clean_read_only_mappings_are_released() {
        let maps = parse_smaps(SMAPS);
        let starts: Vec<usize> = releasable(&maps, "/opt/bgpd").map(|m| m.start).collect();
        // The read-only data and the code; not the relocated data (private pages), not the
        // writable data, not another file's code, not a shared mapping, not the heap.
        assert_eq!(starts, vec![0x55d0c0000000, 0x55d0c01c4000]);
        assert_eq!(releasable(&maps, "/opt/other").count(), 0);
    }

    #[test]
    fn released_code_runs_again() {
        // This test binary's own code and constants are dropped, then used: the pages come
        // back from the file with the same content.
        let before: Vec<u8> = SMAPS.as_bytes().to_vec();
        let released = release_code_pages().expect("smaps is readable");
        assert!(released > 0, "a running test binary has resident code");
        assert_eq!(SMAPS.as_bytes(), &before[..]);
        assert_eq!(parse_smaps(SMAPS).len(), 8);
    }
}
