//! Gives the kernel back the memory a running bgpd no longer uses, once start-up is over and
//! again after each burst of work (a big mesh converging, a full table arriving): the pages
//! of its own code and read-only data that only that work touched, the main thread's stack
//! below the frames in use, SQLite's page cache and the free pages the C library's allocator
//! keeps.
//!
//! **Why.** A node's resident memory is mostly bgpd's code: configuration, SQLite's schema,
//! the gRPC and HTTP stacks, the registration run once, and the kernel maps a 64 KiB window
//! around every page of code that runs (fault-around). Those pages stay mapped for the
//! process's life although most are never run again. Unmapping them (`MADV_DONTNEED`) costs
//! nothing that matters: they stay in the page cache, and code that runs again is mapped
//! again at its next call (a minor fault), so what stays resident is what the node runs.
//!
//! **When.** Once, [`SETTLE`] after start-up is over; then whenever a look at the process's
//! CPU time ([`LOOK_EVERY`]) finds a quiet period after a busy one ([`Bursts`]): in a mesh of
//! a few hundred nodes the sessions converge well after start-up, and what converging ran
//! stayed mapped. An idle node is never busy, so it releases nothing more.
//!
//! **Boundaries.** Only mappings of the bgpd executable that are not writable and hold no
//! private (anonymous) page are released: for those the file's content is the memory's
//! content, so nothing is lost. The relocated read-only data (written at start, then
//! protected) holds private pages and is left alone, as is all writable memory but one
//! range: the main thread's stack below the caller's frame (less a margin for the calls
//! made from there), which holds nothing live and reads as zeros when it is used again.
//! Everything here is advice: on failure the pages simply stay.

use std::time::Duration;

use tokio::sync::watch;

use crate::datastore::DatastoreHandle;

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
    /// The kernel's `THPeligible` (whether huge pages may back the mapping), where shown.
    pub thp_eligible: Option<bool>,
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
                thp_eligible: None,
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
            "THPeligible:" => last.thp_eligible = Some(kib == 1),
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

/// The part of the main thread's stack (`[stack]` in `maps`) below `sp` less `margin`,
/// whole pages: what no frame of a caller at `sp` holds. `None` when `sp` is not on that
/// stack (another thread's) or nothing is left below the margin.
pub fn stack_below(maps: &[Mapping], sp: usize, margin: usize) -> Option<(usize, usize)> {
    const PAGE: usize = 4096;
    let stack = maps.iter().find(|m| m.path == "[stack]")?;
    if !(stack.start..stack.end).contains(&sp) {
        return None;
    }
    let end = sp.checked_sub(margin)? & !(PAGE - 1);
    (end > stack.start).then_some((stack.start, end))
}

/// Room left below this function's frame for the calls it makes while releasing its stack.
const STACK_MARGIN: usize = 16 * 1024;

/// What [`release_unused_pages`] gave back.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Code and read-only data, KiB resident before.
    pub code_kib: u64,
    /// The stack range advised, KiB (what of it was resident is not read again).
    pub stack_kib: u64,
}

/// Unmaps the releasable pages of this executable and, when called on the main thread, its
/// unused stack (see the module's boundaries). Never inlined: `scripts/code-order` counts
/// its calls (a node's first two, at once and 5 s after start-up; a next one no sooner than
/// 30 s later).
#[inline(never)]
pub fn release_unused_pages() -> std::io::Result<Released> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let maps = parse_smaps(&std::fs::read_to_string("/proc/self/smaps")?);
    let dontneed = |start: usize, end: usize| {
        // SAFETY: callers pass a range whose content is not needed (see each call).
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) == 0 }
    };
    let mut released = Released::default();
    for m in releasable(&maps, &exe.to_string_lossy()) {
        // A whole mapping of the executable file that nothing writes and that holds no
        // private page: the next access reads the same bytes back from the file.
        if dontneed(m.start, m.end) {
            released.code_kib += m.rss_kib;
        }
    }
    let here = 0u8;
    let sp = std::hint::black_box(&here) as *const u8 as usize;
    if let Some((start, end)) = stack_below(&maps, sp, STACK_MARGIN) {
        // Below this frame by more than the margin: no live frame is there, and the pages
        // read as zeros when the stack grows into them again.
        if dontneed(start, end) {
            released.stack_kib = ((end - start) / 1024) as u64;
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

/// How long after start-up is over the pages are released a second time: time for the
/// node's sessions to come up and exchange their routes, so that what is mapped again
/// afterwards is what a running node runs. (The first release, at once, gives back what
/// start-up alone ran; `scripts/code-order` lays the sessions' code before it.)
pub const SETTLE: Duration = Duration::from_secs(5);

/// How often the process's CPU time is looked at, after the first release, for a burst of
/// work that has ended. An idle process is woken this often for one `clock_gettime`.
pub const LOOK_EVERY: Duration = Duration::from_secs(30);

/// Finds the ends of bursts of work from the CPU time of successive look periods: a period is
/// busy when the process used at least a thousandth of a core (30 ms in 30 s: an idle node
/// with 200 sessions uses some 5 ms, a node converging in a 200-node mesh some 200 ms), and
/// the pages are released after the first quiet period that follows a busy one. Steady work
/// releases nothing until it stops; each burst is released once.
#[derive(Debug, Default)]
pub struct Bursts {
    busy_since_release: bool,
}

impl Bursts {
    /// One look: `cpu` used over `period`. Whether to release now.
    pub fn look(&mut self, cpu: Duration, period: Duration) -> bool {
        if cpu * 1000 >= period {
            self.busy_since_release = true;
            return false;
        }
        std::mem::take(&mut self.busy_since_release)
    }
}

/// CPU time used by this process so far, all threads.
pub fn process_cpu_time() -> Duration {
    cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// The time of a CPU-time clock (`CLOCK_PROCESS_CPUTIME_ID`, `CLOCK_THREAD_CPUTIME_ID`);
/// zero if it cannot be read.
#[inline]
pub fn cpu_time(clock: libc::clockid_t) -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a plain syscall writing to our timespec.
    if unsafe { libc::clock_gettime(clock, &mut t) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Gives back what the work just done alone used (`after`: what that was, for the log):
/// the datastore's cache, the allocator's free pages, then the unused pages.
async fn release(datastore: &DatastoreHandle, after: &str) {
    if let Some(store) = datastore.store()
        && let Err(e) = store.release_memory().await
    {
        tracing::debug!(error = %e, "the datastore's cache kept");
    }
    trim_heap();
    match release_unused_pages() {
        Ok(r) => tracing::info!(
            code_kib = r.code_kib,
            stack_kib = r.stack_kib,
            "unused code and stack pages released after {after}"
        ),
        Err(e) => tracing::info!(error = %e, "unused pages kept after {after}"),
    }
}

/// Waits until start-up is over (`started`: the first cluster state this node applied), then
/// gives back what start-up alone used: at once, before the sessions map their code (a
/// 10-node mesh converges within a tenth of a second, and start-up's pages were most of its
/// memory then), and again [`SETTLE`] later, what the sessions' start alone used;
/// afterwards, what each burst of work alone used (see [`Bursts`]).
pub async fn run(mut started: watch::Receiver<bool>, datastore: DatastoreHandle) {
    if started.wait_for(|s| *s).await.is_err() {
        return;
    }
    release(&datastore, "start-up").await;
    tokio::time::sleep(SETTLE).await;
    release(&datastore, "the sessions' start").await;
    let mut bursts = Bursts::default();
    let (mut at, mut cpu) = (tokio::time::Instant::now(), process_cpu_time());
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        let (now, cpu_now) = (tokio::time::Instant::now(), process_cpu_time());
        if bursts.look(cpu_now.saturating_sub(cpu), now - at) {
            release(&datastore, "a burst of work").await;
        }
        // The release's own work is not the next period's.
        (at, cpu) = (tokio::time::Instant::now(), process_cpu_time());
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
THPeligible:           1
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
        assert_eq!(
            (maps[4].thp_eligible, maps[1].thp_eligible),
            (Some(true), None)
        );
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
    fn only_the_main_stack_below_the_caller_less_a_margin_is_released() {
        let maps =
            parse_smaps("7ffe46640000-7ffe46661000 rw-p 00000000 00:00 0 [stack]\nRss: 100 kB\n");
        let sp = 0x7ffe4665a1b0;
        // Whole pages, below sp by at least the margin.
        assert_eq!(
            stack_below(&maps, sp, 0x4000),
            Some((0x7ffe46640000, 0x7ffe46656000))
        );
        // Another thread's stack, or no room below the margin: nothing.
        assert_eq!(stack_below(&maps, 0x7f00_0000_0000, 0x4000), None);
        assert_eq!(stack_below(&maps, 0x7ffe46642000, 0x4000), None);
        assert_eq!(stack_below(&parse_smaps(SMAPS), sp, 0x4000), None);
    }

    #[test]
    fn released_code_runs_again() {
        // This test binary's own code and constants are dropped, then used: the pages come
        // back from the file with the same content.
        let before: Vec<u8> = SMAPS.as_bytes().to_vec();
        let released = release_unused_pages().expect("smaps is readable");
        assert!(
            released.code_kib > 0,
            "a running test binary has resident code"
        );
        assert_eq!(SMAPS.as_bytes(), &before[..]);
        assert_eq!(parse_smaps(SMAPS).len(), 8);
    }

    #[test]
    fn each_burst_is_released_once_when_it_has_ended() {
        let period = LOOK_EVERY;
        let idle = Duration::from_millis(5);
        let busy = Duration::from_millis(200);
        let mut b = Bursts::default();
        // Idle from the start: nothing to release.
        assert!(!b.look(idle, period));
        assert!(!b.look(Duration::ZERO, period));
        // Busy, still busy, then quiet: once, at the end.
        assert!(!b.look(busy, period));
        assert!(!b.look(busy, period));
        assert!(b.look(idle, period));
        assert!(!b.look(idle, period));
        // The bound is a thousandth of the period, whatever the period.
        assert!(!b.look(period / 1000, period));
        assert!(b.look(period / 1000 - Duration::from_nanos(1), period));
        assert!(!b.look(Duration::from_millis(2), Duration::from_secs(1)));
        assert!(b.look(Duration::ZERO, Duration::from_secs(1)));
    }

    #[test]
    fn the_process_cpu_time_counts_work() {
        let before = process_cpu_time();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let used = process_cpu_time() - before;
        assert!(
            used >= Duration::from_millis(20),
            "30 ms of work counted {used:?}"
        );
    }
}
