//! Bounded retries with exponential backoff, as pure arithmetic: the caller says how long it
//! has been trying and gets the next pause, or None when the budget is spent. Used while bgpd
//! is unreachable or its datastore is down, so an ADD during a bgpd restart succeeds instead of
//! failing, and an ADD during an outage fails within the budget with "try again later".

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Backoff {
    budget: Duration,
    next: Duration,
    max: Duration,
    /// Attempts made so far (for messages).
    pub attempts: u32,
}

impl Backoff {
    /// Pauses start at 20 ms, double, and never exceed 500 ms; the total never passes `budget`.
    pub fn new(budget: Duration) -> Backoff {
        Backoff {
            budget,
            next: Duration::from_millis(20),
            max: Duration::from_millis(500),
            attempts: 0,
        }
    }

    /// Records an attempt that failed after `elapsed` since the first; the pause before the
    /// next attempt, or None when waiting it would pass the budget.
    pub fn after_failure(&mut self, elapsed: Duration) -> Option<Duration> {
        self.attempts += 1;
        let left = self.budget.checked_sub(elapsed)?;
        if left.is_zero() {
            return None;
        }
        let pause = self.next.min(left);
        self.next = (self.next * 2).min(self.max);
        Some(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn doubles_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_secs(60));
        let pauses: Vec<u64> = (0..8)
            .map(|_| b.after_failure(ms(0)).unwrap().as_millis() as u64)
            .collect();
        assert_eq!(pauses, [20, 40, 80, 160, 320, 500, 500, 500]);
        assert_eq!(b.attempts, 8);
    }

    #[test]
    fn never_passes_the_budget() {
        let mut b = Backoff::new(ms(100));
        assert_eq!(b.after_failure(ms(0)), Some(ms(20)));
        assert_eq!(b.after_failure(ms(30)), Some(ms(40)));
        // 90 ms spent: only 10 ms left, so the pause shrinks to fit.
        assert_eq!(b.after_failure(ms(90)), Some(ms(10)));
        assert_eq!(b.after_failure(ms(100)), None);
        assert_eq!(b.after_failure(ms(5000)), None);
        assert_eq!(b.attempts, 5);
    }

    #[test]
    fn simulated_outage_ends_within_budget() {
        // Each attempt takes 7 ms; the total time spent must stay within the budget.
        for budget in [1u64, 50, 333, 3000] {
            let mut b = Backoff::new(ms(budget));
            let mut t = 0u64;
            loop {
                t += 7;
                match b.after_failure(ms(t)) {
                    Some(p) => t += p.as_millis() as u64,
                    None => break,
                }
                assert!(t <= budget + 7, "budget {budget}: at {t}");
            }
            assert!(b.attempts >= 1);
        }
    }
}
