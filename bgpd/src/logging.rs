//! Logs through `tracing`: one line per event on stderr, level from the configuration.
//!
//! The subscriber is our own, not `tracing-subscriber`'s: bgpd and routewriter log events
//! only (they open no spans), and that one's span registry sets aside a slot per possible
//! thread at start (32 KB written in every process, a lab runs a hundred) besides its
//! formatting machinery. A line reads as that one's did without colours:
//! `2026-12-02T13:18:05.123456Z  WARN message key=value ...`. Spans opened by libraries
//! (h2's and hyper's, at debug level) are accepted and not shown.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

use crate::config::LogLevel;

impl From<LogLevel> for LevelFilter {
    fn from(level: LogLevel) -> Self {
        match level {
            LogLevel::Error => LevelFilter::ERROR,
            LogLevel::Warn => LevelFilter::WARN,
            LogLevel::Info => LevelFilter::INFO,
            LogLevel::Debug => LevelFilter::DEBUG,
            LogLevel::Trace => LevelFilter::TRACE,
        }
    }
}

/// Installs the global subscriber, writing to stderr; a second call keeps the first.
pub fn init(level: LogLevel) {
    let logger = LineLogger {
        max: level.into(),
        out: |line: &str| {
            // One write per line, so lines of concurrent threads do not interleave.
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        },
    };
    let _ = tracing::subscriber::set_global_default(logger);
}

/// A subscriber that writes each enabled event as one line to `out`.
struct LineLogger<F> {
    max: LevelFilter,
    out: F,
}

impl<F: Fn(&str) + Send + Sync + 'static> Subscriber for LineLogger<F> {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.max >= *metadata.level()
    }

    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if self.enabled(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.max)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        // Every span is the same to us: none is shown.
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut line = String::with_capacity(160);
        write_timestamp(&mut line, SystemTime::now());
        let _ = write!(line, " {:>5} ", event.metadata().level());
        // The message first, wherever it is among the fields, then the others.
        let at = line.len();
        event.record(&mut Fields {
            line: &mut line,
            message: true,
        });
        if line.len() == at {
            line.pop(); // no message: the fields' own separator follows the level
        }
        event.record(&mut Fields {
            line: &mut line,
            message: false,
        });
        line.push('\n');
        (self.out)(&line);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Writes an event's message as it is (with `message`), or its other fields as
/// ` key=value` (`Debug`, so strings are quoted).
struct Fields<'a> {
    line: &'a mut String,
    message: bool,
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = match (self.message, field.name() == "message") {
            (true, true) => write!(self.line, "{value:?}"),
            (false, false) => write!(self.line, " {}={value:?}", field.name()),
            _ => Ok(()),
        };
    }
}

/// `t` as RFC 3339 in UTC with microseconds: `2026-12-02T13:18:05.123456Z`.
fn write_timestamp(out: &mut String, t: SystemTime) {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let day = secs % 86_400;
    let _ = write!(
        out,
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        day / 3600,
        day / 60 % 60,
        day % 60,
        since.subsec_micros()
    );
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`:
/// count in 400-year eras of 146097 days, years starting on 1 March so that the leap day is
/// the last of its year).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    #[test]
    fn dates_from_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(10_956), (1999, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(11_017), (2000, 3, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(20_789), (2026, 12, 2));
        // Day by day over four centuries: every date follows the one before.
        let mut prev = civil_from_days(-1);
        for days in 0..146_097 {
            let (y, m, d) = civil_from_days(days);
            let next_day = (prev.0, prev.1, prev.2 + 1);
            let next_month = (prev.0, prev.1 + 1, 1);
            let next_year = (prev.0 + 1, 1, 1);
            assert!(
                [next_day, next_month, next_year].contains(&(y, m, d)),
                "{prev:?} then {:?}",
                (y, m, d)
            );
            assert!((1..=12).contains(&m) && (1..=31).contains(&d));
            prev = (y, m, d);
        }
        assert_eq!(prev, (2369, 12, 31));
    }

    #[test]
    fn timestamp_is_rfc3339_utc() {
        let mut s = String::new();
        let t = UNIX_EPOCH + Duration::new(1_796_217_485, 123_456_789);
        write_timestamp(&mut s, t);
        assert_eq!(s, "2026-12-02T13:18:05.123456Z");
    }

    /// A logger at `max` whose lines land in the returned buffer.
    fn capture(max: LevelFilter) -> (impl Subscriber, Arc<Mutex<String>>) {
        let lines = Arc::new(Mutex::new(String::new()));
        let sink = lines.clone();
        let logger = LineLogger {
            max,
            out: move |l: &str| sink.lock().unwrap().push_str(l),
        };
        (logger, lines)
    }

    #[test]
    fn one_line_per_event_with_message_first() {
        let (logger, lines) = capture(LevelFilter::INFO);
        tracing::subscriber::with_default(logger, || {
            let peer = std::net::Ipv4Addr::new(10, 0, 0, 1);
            tracing::warn!(peer = %peer, count = 3, name = "a b", "session {} down", 7);
            tracing::info!("plain");
            tracing::debug!("not shown");
            let span = tracing::info_span!("ignored", x = 1);
            let _in = span.enter();
            tracing::error!(error = ?Some(2), "in a span");
            tracing::warn!(only = 1);
        });
        let text = lines.lock().unwrap().clone();
        let got: Vec<&str> = text.lines().map(|l| l.split_once(' ').unwrap().1).collect();
        assert_eq!(
            got,
            [
                " WARN session 7 down peer=10.0.0.1 count=3 name=\"a b\"",
                " INFO plain",
                "ERROR in a span error=Some(2)",
                " WARN only=1",
            ]
        );
        assert!(text.ends_with('\n'));
        for l in text.lines() {
            let (ts, _) = l.split_once(' ').unwrap();
            assert!(
                ts.len() == 27 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
                "{l}"
            );
        }
    }

    #[test]
    fn level_filter_off_shows_nothing() {
        let (logger, lines) = capture(LevelFilter::OFF);
        tracing::subscriber::with_default(logger, || tracing::error!("hidden"));
        assert_eq!(lines.lock().unwrap().as_str(), "");
    }
}
