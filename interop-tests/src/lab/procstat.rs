//! What the kernel says about a process, for benchmarks: CPU time used so far and resident
//! memory, read from /proc by PID, and the calling thread's own CPU time. A process that is
//! gone reads as zero (the caller decides whether that matters), so a measurement never
//! panics on a race with an exiting process.

/// CPU time the calling thread has used so far (user + system).
pub fn thread_cpu() -> std::time::Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a plain syscall writing to our timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// CPU seconds (user + system) the process has used so far.
///
/// /proc/<pid>/stat counts in clock ticks (10 ms), too coarse for a daemon that needs a few
/// milliseconds to load a mesh; the scheduler's own nanosecond count (`schedstat`) is exact
/// but per thread, and only for live ones. So: the larger of the two, the tick count (which
/// includes threads that have exited) and the sum over the live threads' nanoseconds.
pub fn cpu_seconds(pid: i32) -> f64 {
    stat_cpu_seconds(pid).max(schedstat_cpu_seconds(pid))
}

fn stat_cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces and parentheses: count fields after the last ')'.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the command name.
    let ticks = f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    ticks as f64 / clock_ticks_per_second()
}

fn schedstat_cpu_seconds(pid: i32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// The CPU time of each live thread of a process, by thread id, for measuring a span.
/// Summing the live threads at both ends is wrong when threads come and go (a runtime ends
/// its idle blocking threads): the sum can even go down. Per thread, a span counts what each
/// thread used in it, all of it for a thread born in it; what a thread used between the
/// start and its exit is not seen, so the figure is a lower bound that never goes negative.
#[derive(Debug, Clone, Default)]
pub struct ThreadTimes(std::collections::BTreeMap<u32, u64>);

impl ThreadTimes {
    pub fn of(pid: i32) -> Self {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Self::default();
        };
        ThreadTimes(
            tasks
                .flatten()
                .filter_map(|t| {
                    let tid = t.file_name().to_str()?.parse::<u32>().ok()?;
                    let s = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
                    Some((tid, s.split_whitespace().next()?.parse::<u64>().ok()?))
                })
                .collect(),
        )
    }

    /// CPU seconds the threads used since `earlier` (of the same process).
    pub fn seconds_since(&self, earlier: &ThreadTimes) -> f64 {
        let ns: u64 = self
            .0
            .iter()
            .map(|(tid, ns)| ns.saturating_sub(earlier.0.get(tid).copied().unwrap_or(0)))
            .sum();
        ns as f64 / 1e9
    }
}

/// Resident memory now (`VmRSS`), MiB.
pub fn rss_mib(pid: i32) -> f64 {
    status_kib(pid, "VmRSS:") / 1024.0
}

/// Private anonymous resident memory now (`RssAnon`: heap, stacks; not the mapped code and
/// libraries, which other processes may share), MiB.
pub fn anon_rss_mib(pid: i32) -> f64 {
    status_kib(pid, "RssAnon:") / 1024.0
}

/// Peak resident memory (`VmHWM`), MiB.
pub fn peak_rss_mib(pid: i32) -> f64 {
    status_kib(pid, "VmHWM:") / 1024.0
}

/// Whether the process still exists (a zombie counts as gone).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(|st| st != "Z"))
        })
        .unwrap_or(false)
}

fn status_kib(pid: i32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id() as i32;
        assert!(alive(me));
        assert!(rss_mib(me) > 0.0);
        assert!(peak_rss_mib(me) >= rss_mib(me));
        let anon = anon_rss_mib(me);
        assert!(
            anon > 0.0 && anon < rss_mib(me),
            "anon {anon} of {}",
            rss_mib(me)
        );
        // Burn a little CPU: the count must see it, with better than tick resolution.
        let before = cpu_seconds(me);
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(cpu_seconds(me) > before, "{before}");
        let threads = ThreadTimes::of(me);
        let span_start = std::time::Instant::now();
        // A thread born and busy within the span counts whole.
        std::thread::spawn(|| {
            // 30 ms of this thread's CPU time, not of the wall clock: on a loaded machine a
            // thread spinning 30 ms of wall time once ran for only 20 ms.
            let mut x = 0u64;
            while thread_cpu() < std::time::Duration::from_millis(30) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            // Alive until measured.
            std::thread::sleep(std::time::Duration::from_millis(200));
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        let used = ThreadTimes::of(me).seconds_since(&threads);
        assert!(used >= 0.02, "{used}");
        assert!(used <= span_start.elapsed().as_secs_f64() * 2.0, "{used}");
        assert_eq!(rss_mib(-1), 0.0);
        assert!(!alive(-1));
    }
}
