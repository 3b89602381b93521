//! Label selectors, as Calico writes them: `all()`, `global()`, `k == 'v'`, `k != 'v'`,
//! `has(k)`, `k in {'a', 'b'}`, `k not in {...}`, `k contains 's'`, `k starts with 's'`,
//! `k ends with 's'`, `!`, `&&`, `||` and parentheses; and Kubernetes' `LabelSelector`
//! (matchLabels + matchExpressions), converted into the same tree. Parsed once into a small
//! tree, evaluated against one label map. A syntax error names its byte position.
//!
//! `Display` prints a canonical text: it parses back to an equal tree, and equal trees print
//! equally, so the text can name things (the compiler hashes it into set names). Parsing
//! sorts and de-duplicates the values of `in` / `not in` for that reason.
//!
//! This module knows labels only: which labels an endpoint or a namespace has (the implicit
//! ones too) is the caller's business.

use std::collections::BTreeMap;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Selector {
    All,
    /// Calico's `global()`: the non-namespaced resources. margay's endpoints are all pods,
    /// which live in namespaces, so as a namespace selector it matches none of them.
    Global,
    Has(String),
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    /// The label is present and its value contains / starts with / ends with the text.
    Contains(String, String),
    StartsWith(String, String),
    EndsWith(String, String),
    Not(Box<Selector>),
    And(Box<Selector>, Box<Selector>),
    Or(Box<Selector>, Box<Selector>),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("selector {text:?}: {reason} at position {position}")]
pub struct SelectorError {
    pub text: String,
    pub position: usize,
    pub reason: String,
}

impl Selector {
    /// Parses a selector; the empty string means `all()`.
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        let mut p = Parser { text, pos: 0 };
        p.skip_ws();
        if p.pos == text.len() {
            return Ok(Selector::All);
        }
        let s = p.or()?;
        p.skip_ws();
        if p.pos != text.len() {
            return Err(p.error("unexpected input"));
        }
        Ok(s)
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Selector::All => true,
            Selector::Global => false,
            Selector::Has(k) => labels.contains_key(k),
            Selector::Eq(k, v) => labels.get(k) == Some(v),
            // As in Calico: a missing label is "not equal".
            Selector::Ne(k, v) => labels.get(k) != Some(v),
            Selector::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Selector::NotIn(k, vs) => !labels.get(k).is_some_and(|l| vs.contains(l)),
            Selector::Contains(k, s) => labels.get(k).is_some_and(|l| l.contains(s.as_str())),
            Selector::StartsWith(k, s) => labels.get(k).is_some_and(|l| l.starts_with(s.as_str())),
            Selector::EndsWith(k, s) => labels.get(k).is_some_and(|l| l.ends_with(s.as_str())),
            Selector::Not(s) => !s.matches(labels),
            Selector::And(a, b) => a.matches(labels) && b.matches(labels),
            Selector::Or(a, b) => a.matches(labels) || b.matches(labels),
        }
    }

    /// `a && b`, dropping an `all()` on either side.
    pub fn and(self, other: Selector) -> Selector {
        match (self, other) {
            (Selector::All, s) | (s, Selector::All) => s,
            (a, b) => Selector::And(Box::new(a), Box::new(b)),
        }
    }
}

/// A value quoted so that the parser reads it back: single quotes unless it holds one.
fn quoted(v: &str) -> String {
    if v.contains('\'') {
        format!("\"{v}\"")
    } else {
        format!("'{v}'")
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |vs: &[String]| vs.iter().map(|v| quoted(v)).collect::<Vec<_>>().join(", ");
        match self {
            Selector::All => write!(f, "all()"),
            Selector::Global => write!(f, "global()"),
            Selector::Has(k) => write!(f, "has({k})"),
            Selector::Eq(k, v) => write!(f, "{k} == {}", quoted(v)),
            Selector::Ne(k, v) => write!(f, "{k} != {}", quoted(v)),
            Selector::In(k, vs) => write!(f, "{k} in {{{}}}", list(vs)),
            Selector::NotIn(k, vs) => write!(f, "{k} not in {{{}}}", list(vs)),
            Selector::Contains(k, v) => write!(f, "{k} contains {}", quoted(v)),
            Selector::StartsWith(k, v) => write!(f, "{k} starts with {}", quoted(v)),
            Selector::EndsWith(k, v) => write!(f, "{k} ends with {}", quoted(v)),
            // `!has(k)` is common enough to print without parentheses; it parses back alike.
            Selector::Not(s) if matches!(**s, Selector::Has(_)) => write!(f, "!{s}"),
            Selector::Not(s) => write!(f, "!({s})"),
            Selector::And(a, b) => write!(f, "({a} && {b})"),
            Selector::Or(a, b) => write!(f, "({a} || {b})"),
        }
    }
}

/// Kubernetes' label selector: every `match_labels` pair and every requirement must hold.
/// Empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<LabelRequirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelRequirement {
    pub key: String,
    pub operator: LabelOperator,
    /// For `In` / `NotIn`; empty for `Exists` / `DoesNotExist`.
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl LabelSelector {
    /// The same condition as a `Selector` (`all()` when empty). Kubernetes' `NotIn` matches
    /// a missing label, as Calico's `not in` does.
    pub fn to_selector(&self) -> Selector {
        let pairs = self
            .match_labels
            .iter()
            .map(|(k, v)| Selector::Eq(k.clone(), v.clone()));
        let requirements = self.match_expressions.iter().map(|r| {
            let mut values = r.values.clone();
            values.sort();
            values.dedup();
            match r.operator {
                LabelOperator::In => Selector::In(r.key.clone(), values),
                LabelOperator::NotIn => Selector::NotIn(r.key.clone(), values),
                LabelOperator::Exists => Selector::Has(r.key.clone()),
                LabelOperator::DoesNotExist => {
                    Selector::Not(Box::new(Selector::Has(r.key.clone())))
                }
            }
        });
        pairs.chain(requirements).fold(Selector::All, Selector::and)
    }
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

fn is_label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-_./".contains(c)
}

impl Parser<'_> {
    fn error(&self, reason: &str) -> SelectorError {
        SelectorError {
            text: self.text.to_owned(),
            position: self.pos,
            reason: reason.to_owned(),
        }
    }

    fn rest(&self) -> &str {
        self.text.get(self.pos..).unwrap_or("")
    }

    fn skip_ws(&mut self) {
        let trimmed = self.rest().trim_start();
        self.pos = self.text.len() - trimmed.len();
    }

    /// Consumes `token` (after whitespace) if it comes next.
    fn eat(&mut self, token: &str) -> bool {
        self.skip_ws();
        if self.rest().starts_with(token) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    /// Consumes the keyword `word` if it comes next as a whole word (`in` is not the start
    /// of `inner`).
    fn eat_word(&mut self, word: &str) -> bool {
        self.skip_ws();
        let rest = self.rest();
        let whole =
            rest.starts_with(word) && !rest[word.len()..].chars().next().is_some_and(is_label_char);
        if whole {
            self.pos += word.len();
        }
        whole
    }

    fn expect(&mut self, token: &str) -> Result<(), SelectorError> {
        if self.eat(token) {
            Ok(())
        } else {
            Err(self.error(&format!("expected '{token}'")))
        }
    }

    fn or(&mut self) -> Result<Selector, SelectorError> {
        let mut left = self.and()?;
        while self.eat("||") {
            left = Selector::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Selector, SelectorError> {
        let mut left = self.unary()?;
        while self.eat("&&") {
            left = Selector::And(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Selector, SelectorError> {
        // `!=` is an operator, not a negation, but it never starts a term.
        if self.eat("!") {
            return Ok(Selector::Not(Box::new(self.unary()?)));
        }
        if self.eat("(") {
            let inner = self.or()?;
            self.expect(")")?;
            return Ok(inner);
        }
        self.term()
    }

    fn term(&mut self) -> Result<Selector, SelectorError> {
        self.skip_ws();
        let start = self.pos;
        let name = self.label()?;
        for (function, selector) in [("all", Selector::All), ("global", Selector::Global)] {
            if name == function && self.eat("(") {
                self.expect(")")?;
                return Ok(selector);
            }
        }
        if name == "has" && self.eat("(") {
            let key = self.label()?;
            self.expect(")")?;
            return Ok(Selector::Has(key));
        }
        if self.eat("==") {
            return Ok(Selector::Eq(name, self.string()?));
        }
        if self.eat("!=") {
            return Ok(Selector::Ne(name, self.string()?));
        }
        if self.eat_word("not") {
            if !self.eat_word("in") {
                return Err(self.error("expected 'in' after 'not'"));
            }
            return Ok(Selector::NotIn(name, self.set()?));
        }
        if self.eat_word("in") {
            return Ok(Selector::In(name, self.set()?));
        }
        if self.eat_word("contains") {
            return Ok(Selector::Contains(name, self.string()?));
        }
        for (first, make) in [
            (
                "starts",
                Selector::StartsWith as fn(String, String) -> Selector,
            ),
            ("ends", Selector::EndsWith),
        ] {
            if self.eat_word(first) {
                if !self.eat_word("with") {
                    return Err(self.error(&format!("expected 'with' after '{first}'")));
                }
                return Ok(make(name, self.string()?));
            }
        }
        self.pos = start.max(self.pos);
        Err(self
            .error("expected ==, !=, in, not in, contains, starts with or ends with after a label"))
    }

    /// A label key: letters, digits and `-_./`, as Kubernetes label keys.
    fn label(&mut self) -> Result<String, SelectorError> {
        self.skip_ws();
        let len = self
            .rest()
            .find(|c: char| !is_label_char(c))
            .unwrap_or(self.rest().len());
        if len == 0 {
            return Err(self.error("expected a label"));
        }
        let label = self.rest()[..len].to_owned();
        self.pos += len;
        Ok(label)
    }

    /// A quoted value, 'single' or "double".
    fn string(&mut self) -> Result<String, SelectorError> {
        self.skip_ws();
        let quote = match self.rest().chars().next() {
            Some(q @ ('\'' | '"')) => q,
            _ => return Err(self.error("expected a quoted value")),
        };
        let body = &self.rest()[1..];
        match body.find(quote) {
            Some(end) => {
                let value = body[..end].to_owned();
                self.pos += end + 2;
                Ok(value)
            }
            None => Err(self.error("unterminated quoted value")),
        }
    }

    /// `{'a', 'b'}`, sorted and de-duplicated (the canonical form).
    fn set(&mut self) -> Result<Vec<String>, SelectorError> {
        self.expect("{")?;
        let mut values = Vec::new();
        if !self.eat("}") {
            loop {
                values.push(self.string()?);
                if self.eat("}") {
                    break;
                }
                self.expect(",")?;
            }
        }
        values.sort();
        values.dedup();
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn evaluates_every_form() {
        let l = labels(&[
            ("zone", "a"),
            ("gpu", "true"),
            ("kubernetes.io/os", "linux"),
        ]);
        let cases = [
            ("", true),
            ("all()", true),
            ("zone == 'a'", true),
            ("zone == \"b\"", false),
            ("zone != 'b'", true),
            ("rack != 'x'", true),
            ("has(gpu)", true),
            ("has(rack)", false),
            ("zone in {'a', 'b'}", true),
            ("zone in {}", false),
            ("zone not in {'a'}", false),
            ("rack not in {'a'}", true),
            ("!has(rack)", true),
            ("has(gpu) && zone == 'a'", true),
            ("has(gpu) && zone == 'b'", false),
            ("zone == 'b' || has(gpu)", true),
            (
                "!(zone == 'a' || has(rack)) || kubernetes.io/os == 'linux'",
                true,
            ),
            ("!(zone == 'a' || has(rack))", false),
            ("zone == 'a' && (has(rack) || has(gpu))", true),
        ];
        for (text, want) in cases {
            let s = Selector::parse(text).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(s.matches(&l), want, "{text}");
            // What Display prints parses back to the same meaning.
            let again = Selector::parse(&s.to_string()).unwrap();
            assert_eq!(again, s, "{text} -> {s}");
        }
    }

    #[test]
    fn precedence_and_binds_tighter_than_or() {
        let s = Selector::parse("has(a) || has(b) && has(c)").unwrap();
        assert!(s.matches(&labels(&[("a", "")])));
        assert!(!s.matches(&labels(&[("b", "")])));
    }

    #[test]
    fn errors_name_the_position() {
        let cases = [
            ("zone = 'a'", 5),
            ("zone == a", 8),
            ("has(zone", 8),
            ("zone == 'a' &&", 14),
            ("(has(a)", 7),
            ("zone in {'a' 'b'}", 13),
            ("zone == 'a", 8),
            ("has(a) extra", 7),
            ("&& has(a)", 0),
        ];
        for (text, position) in cases {
            let e = Selector::parse(text).expect_err(text);
            assert_eq!(e.position, position, "{text}: {e}");
            assert!(
                e.to_string().contains(&format!("position {position}")),
                "{e}"
            );
        }
    }

    #[test]
    fn evaluates_calico_string_operators_and_global() {
        let l = labels(&[("app", "frontend-v2"), ("team", "it's")]);
        let cases = [
            ("app contains 'end'", true),
            ("app contains 'back'", false),
            ("rack contains ''", false),
            ("app starts with 'front'", true),
            ("app starts with 'end'", false),
            ("app ends with '-v2'", true),
            ("app ends with 'front'", false),
            ("team == \"it's\"", true),
            ("global()", false),
            ("!global()", true),
            ("!has(rack) && has(app)", true),
            ("app in {'b', 'a', 'b'}", false),
            ("inner in {'x'}", false),
            ("notes not in {'x'}", true),
        ];
        for (text, want) in cases {
            let s = Selector::parse(text).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(s.matches(&l), want, "{text}");
            let again = Selector::parse(&s.to_string()).unwrap();
            assert_eq!(again, s, "{text} -> {s}");
        }
    }

    #[test]
    fn display_is_canonical() {
        let pairs = [
            ("zone in {'b','a','a'}", "zone in {'a', 'b'}"),
            ("!has( gpu )", "!has(gpu)"),
            ("!(zone == 'a')", "!(zone == 'a')"),
            ("a  starts   with 'x'", "a starts with 'x'"),
            (
                "has(a) && has(b) || has(c)",
                "((has(a) && has(b)) || has(c))",
            ),
        ];
        for (text, canonical) in pairs {
            assert_eq!(Selector::parse(text).unwrap().to_string(), canonical);
        }
        // Differently written, equal meaning, equal text.
        assert_eq!(
            Selector::parse("k in {'x', 'y'}").unwrap().to_string(),
            Selector::parse("k in {\"y\",'x'}").unwrap().to_string()
        );
    }

    #[test]
    fn keyword_errors_name_the_position() {
        for (text, position) in [("a starts 'x'", 9), ("a ends wit 'x'", 7), ("a not 'x'", 6)] {
            let e = Selector::parse(text).expect_err(text);
            assert_eq!(e.position, position, "{text}: {e}");
        }
    }

    #[test]
    fn label_selector_converts_to_the_same_condition() {
        let empty = LabelSelector::default();
        assert_eq!(empty.to_selector(), Selector::All);
        let ls = LabelSelector {
            match_labels: [("app".to_string(), "web".to_string())].into(),
            match_expressions: vec![
                LabelRequirement {
                    key: "tier".into(),
                    operator: LabelOperator::In,
                    values: vec!["b".into(), "a".into()],
                },
                LabelRequirement {
                    key: "env".into(),
                    operator: LabelOperator::NotIn,
                    values: vec!["prod".into()],
                },
                LabelRequirement {
                    key: "gpu".into(),
                    operator: LabelOperator::Exists,
                    values: vec![],
                },
                LabelRequirement {
                    key: "legacy".into(),
                    operator: LabelOperator::DoesNotExist,
                    values: vec![],
                },
            ],
        };
        let s = ls.to_selector();
        assert_eq!(
            s.to_string(),
            "((((app == 'web' && tier in {'a', 'b'}) && env not in {'prod'}) && has(gpu)) && !has(legacy))"
        );
        let yes = labels(&[("app", "web"), ("tier", "a"), ("gpu", "1")]);
        assert!(s.matches(&yes));
        let mut no = yes.clone();
        no.insert("env".into(), "prod".into());
        assert!(!s.matches(&no));
        let mut no = yes.clone();
        no.insert("legacy".into(), "".into());
        assert!(!s.matches(&no));
        let mut no = yes.clone();
        no.remove("gpu");
        assert!(!s.matches(&no));
        let mut no = yes;
        no.insert("tier".into(), "c".into());
        assert!(!s.matches(&no));
    }
}
