//! Node selectors, as Calico writes them: `all()`, `k == 'v'`, `k != 'v'`, `has(k)`,
//! `k in {'a', 'b'}`, `k not in {...}`, `!`, `&&`, `||` and parentheses. Parsed once into a
//! small tree, evaluated against a node's labels. A syntax error names its byte position.

use std::collections::BTreeMap;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    All,
    Has(String),
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
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
            Selector::Has(k) => labels.contains_key(k),
            Selector::Eq(k, v) => labels.get(k) == Some(v),
            // As in Calico: a missing label is "not equal".
            Selector::Ne(k, v) => labels.get(k) != Some(v),
            Selector::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Selector::NotIn(k, vs) => !labels.get(k).is_some_and(|l| vs.contains(l)),
            Selector::Not(s) => !s.matches(labels),
            Selector::And(a, b) => a.matches(labels) && b.matches(labels),
            Selector::Or(a, b) => a.matches(labels) || b.matches(labels),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |vs: &[String]| {
            vs.iter()
                .map(|v| format!("'{v}'"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Selector::All => write!(f, "all()"),
            Selector::Has(k) => write!(f, "has({k})"),
            Selector::Eq(k, v) => write!(f, "{k} == '{v}'"),
            Selector::Ne(k, v) => write!(f, "{k} != '{v}'"),
            Selector::In(k, vs) => write!(f, "{k} in {{{}}}", list(vs)),
            Selector::NotIn(k, vs) => write!(f, "{k} not in {{{}}}", list(vs)),
            Selector::Not(s) => write!(f, "!({s})"),
            Selector::And(a, b) => write!(f, "({a} && {b})"),
            Selector::Or(a, b) => write!(f, "({a} || {b})"),
        }
    }
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
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
        if name == "all" && self.eat("(") {
            self.expect(")")?;
            return Ok(Selector::All);
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
        if self.eat("not") {
            self.skip_ws();
            if !self.rest().starts_with("in") {
                return Err(self.error("expected 'in' after 'not'"));
            }
            self.pos += 2;
            return Ok(Selector::NotIn(name, self.set()?));
        }
        if self.eat("in") {
            return Ok(Selector::In(name, self.set()?));
        }
        self.pos = start.max(self.pos);
        Err(self.error("expected ==, !=, in or not in after a label"))
    }

    /// A label key: letters, digits and `-_./`, as Kubernetes label keys.
    fn label(&mut self) -> Result<String, SelectorError> {
        self.skip_ws();
        let len = self
            .rest()
            .find(|c: char| !(c.is_ascii_alphanumeric() || "-_./".contains(c)))
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

    fn set(&mut self) -> Result<Vec<String>, SelectorError> {
        self.expect("{")?;
        let mut values = Vec::new();
        if self.eat("}") {
            return Ok(values);
        }
        loop {
            values.push(self.string()?);
            if self.eat("}") {
                return Ok(values);
            }
            self.expect(",")?;
        }
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
}
