//! Writing the Prometheus text exposition format (0.0.4): metric families with their HELP and
//! TYPE lines, samples with escaped label values, histograms. Only the writing: what is
//! counted, and where, belongs to the daemons.

use std::fmt::{Display, Write as _};

/// The TYPE of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        }
    }
}

/// One exposition being written; every name gets `prefix` in front.
#[derive(Debug)]
pub struct Exposition {
    prefix: &'static str,
    out: String,
}

impl Exposition {
    pub fn new(prefix: &'static str) -> Self {
        Self {
            prefix,
            out: String::new(),
        }
    }

    /// Starts a family: its HELP and TYPE lines. Samples of it follow.
    pub fn family(&mut self, name: &str, help: &str, kind: Kind) -> &mut Self {
        let p = self.prefix;
        let _ = writeln!(self.out, "# HELP {p}{name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {p}{name} {}", kind.name());
        self
    }

    /// One sample of `name` (with the prefix added) and its labels.
    pub fn sample(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        value: impl Display,
    ) -> &mut Self {
        let _ = write!(self.out, "{}{name}", self.prefix);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }

    /// A family with a single unlabelled sample.
    pub fn single(&mut self, name: &str, help: &str, kind: Kind, value: impl Display) -> &mut Self {
        self.family(name, help, kind).sample(name, &[], value)
    }

    /// The samples of one histogram series: `buckets` are (upper bound, cumulative count)
    /// pairs in increasing order; `+Inf` is `count`.
    pub fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        buckets: &[(f64, u64)],
        sum: f64,
        count: u64,
    ) -> &mut Self {
        let bucket = format!("{name}_bucket");
        for (le, n) in buckets {
            let le = le.to_string();
            let mut l = labels.to_vec();
            l.push(("le", &le));
            self.sample(&bucket, &l, n);
        }
        let mut l = labels.to_vec();
        l.push(("le", "+Inf"));
        self.sample(&bucket, &l, count);
        self.sample(&format!("{name}_sum"), labels, sum);
        self.sample(&format!("{name}_count"), labels, count)
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// A label value: backslash, double quote and newline escaped.
pub fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_histograms() {
        let mut e = Exposition::new("x_");
        e.single("up", "1 when up.", Kind::Gauge, 1);
        e.family("hits_total", "Hits\nby path.", Kind::Counter)
            .sample("hits_total", &[("path", "/a\"b\\c\nd"), ("code", "200")], 3);
        e.family("seconds", "Latency.", Kind::Histogram).histogram(
            "seconds",
            &[("m", "get")],
            &[(0.1, 1), (1.0, 2)],
            1.25,
            3,
        );
        let t = e.finish();
        assert_eq!(
            t,
            "# HELP x_up 1 when up.\n# TYPE x_up gauge\nx_up 1\n\
             # HELP x_hits_total Hits\\nby path.\n# TYPE x_hits_total counter\n\
             x_hits_total{path=\"/a\\\"b\\\\c\\nd\",code=\"200\"} 3\n\
             # HELP x_seconds Latency.\n# TYPE x_seconds histogram\n\
             x_seconds_bucket{m=\"get\",le=\"0.1\"} 1\n\
             x_seconds_bucket{m=\"get\",le=\"1\"} 2\n\
             x_seconds_bucket{m=\"get\",le=\"+Inf\"} 3\n\
             x_seconds_sum{m=\"get\"} 1.25\n\
             x_seconds_count{m=\"get\"} 3\n"
        );
    }
}
