//! The signals bgpd and routewriter act on (SIGTERM, SIGINT, SIGHUP), as an async source: a
//! handler writes each caught signal's number to a pipe, and [`Signals::next`] reads it.
//!
//! Not tokio's `signal` module: with it, every runtime keeps a table with a channel for each
//! of the 64 signals from the moment it is built (24 KB written in every process, and a lab
//! runs a hundred); this keeps one pipe, made only by the process that catches signals.
//!
//! **Boundaries.** Handlers are process-wide: the last [`Signals`] made receives every
//! signal caught from then on (a test or a restarted daemon in one process makes more than
//! one). The handler only writes one byte (`write(2)` is async-signal-safe) and keeps
//! `errno`.

use std::io;
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use tokio::net::unix::pipe;

/// A signal we act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: stop.
    Terminate,
    /// SIGINT: stop.
    Interrupt,
    /// SIGHUP: read the configuration again (bgpd).
    Hangup,
}

impl Signal {
    /// The signal's usual name, for logs: `SIGTERM`, `SIGINT`, `SIGHUP`.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Terminate => "SIGTERM",
            Signal::Interrupt => "SIGINT",
            Signal::Hangup => "SIGHUP",
        }
    }

    fn number(self) -> libc::c_int {
        match self {
            Signal::Terminate => libc::SIGTERM,
            Signal::Interrupt => libc::SIGINT,
            Signal::Hangup => libc::SIGHUP,
        }
    }

    fn from_number(n: libc::c_int) -> Option<Signal> {
        [Signal::Terminate, Signal::Interrupt, Signal::Hangup]
            .into_iter()
            .find(|s| s.number() == n)
    }
}

/// The write end of the newest [`Signals`]' pipe; -1 before the first.
static WRITE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(n: libc::c_int) {
    let fd = WRITE_FD.load(Ordering::Relaxed);
    if fd < 0 {
        return;
    }
    let byte = n as u8;
    // SAFETY: errno is this thread's; write(2) is async-signal-safe and gets a valid
    // one-byte buffer. A full pipe (65536 signals unread) drops the signal.
    unsafe {
        let errno = *libc::__errno_location();
        libc::write(fd, (&byte as *const u8).cast(), 1);
        *libc::__errno_location() = errno;
    }
}

/// Caught signals, to await.
pub struct Signals {
    rx: pipe::Receiver,
}

impl Signals {
    /// Catches `signals` from now on (their default actions no longer apply). Needs a
    /// runtime with I/O enabled.
    pub fn catch(signals: &[Signal]) -> io::Result<Signals> {
        let (tx, rx) = pipe::pipe()?;
        // The write end stays open for the process's life, also once a newer `Signals`
        // takes over: a handler running at that moment may still write to it, and a closed
        // number could by then name another file.
        let fd = tx.into_nonblocking_fd()?.into_raw_fd();
        WRITE_FD.store(fd, Ordering::SeqCst);
        for s in signals {
            // SAFETY: a zeroed sigaction with a handler, an empty mask and SA_RESTART (so
            // that interrupted system calls go on) is valid; the handler is async-signal-safe.
            let installed = unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(s.number(), &action, std::ptr::null_mut())
            };
            if installed != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Signals { rx })
    }

    /// The next caught signal; `None` if the pipe can no longer be read (the runtime is
    /// shutting down). Cancel-safe: a signal is taken from the pipe only when returned.
    pub async fn next(&mut self) -> Option<Signal> {
        let mut byte = [0u8; 1];
        loop {
            self.rx.readable().await.ok()?;
            match self.rx.try_read(&mut byte) {
                Ok(1) => {
                    if let Some(s) = Signal::from_number(libc::c_int::from(byte[0])) {
                        return Some(s);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The write end is never closed; anything else is the end.
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn raise(s: Signal) {
        // SAFETY: raising a signal whose handler is installed.
        assert_eq!(unsafe { libc::raise(s.number()) }, 0);
    }

    async fn next(signals: &mut Signals) -> Option<Signal> {
        tokio::time::timeout(Duration::from_secs(5), signals.next())
            .await
            .expect("a caught signal arrives")
    }

    // One test: handlers are process-wide, and nextest runs each test in its own process.
    #[tokio::test]
    async fn caught_signals_arrive_in_order_and_the_newest_catcher_gets_them() {
        let mut first = Signals::catch(&[Signal::Terminate, Signal::Hangup]).unwrap();
        raise(Signal::Hangup);
        raise(Signal::Terminate);
        raise(Signal::Hangup);
        assert_eq!(next(&mut first).await, Some(Signal::Hangup));
        assert_eq!(next(&mut first).await, Some(Signal::Terminate));
        assert_eq!(next(&mut first).await, Some(Signal::Hangup));

        // Cancelled while waiting: nothing is lost.
        let waited = tokio::time::timeout(Duration::from_millis(20), first.next()).await;
        assert!(waited.is_err(), "nothing was raised");
        raise(Signal::Terminate);
        assert_eq!(next(&mut first).await, Some(Signal::Terminate));

        let mut second = Signals::catch(&[Signal::Interrupt]).unwrap();
        raise(Signal::Interrupt);
        assert_eq!(next(&mut second).await, Some(Signal::Interrupt));
        let stale = tokio::time::timeout(Duration::from_millis(50), first.next()).await;
        assert!(stale.is_err(), "the first catcher gets nothing more");
    }

    #[test]
    fn numbers_round_trip() {
        for s in [Signal::Terminate, Signal::Interrupt, Signal::Hangup] {
            assert_eq!(Signal::from_number(s.number()), Some(s));
        }
        assert_eq!(
            [Signal::Terminate, Signal::Interrupt, Signal::Hangup].map(Signal::name),
            ["SIGTERM", "SIGINT", "SIGHUP"]
        );
        assert_eq!(Signal::from_number(libc::SIGUSR1), None);
    }
}
