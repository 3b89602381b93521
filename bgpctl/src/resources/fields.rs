//! Walking one object of a document field by field: every field read is taken out, so what is
//! left at `finish` is unknown and refused by its path, never silently dropped.

use serde_json::{Map, Value};

/// A refused field: its path in the document (`spec.ipipMode`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, FieldError>;

pub struct Obj {
    path: String,
    map: Map<String, Value>,
}

impl Obj {
    /// `value` must be a mapping; `path` is where it sits (empty for the document itself).
    pub fn new(path: &str, value: Value) -> Result<Self> {
        match value {
            Value::Object(map) => Ok(Self {
                path: path.to_owned(),
                map,
            }),
            Value::Null => Ok(Self {
                path: path.to_owned(),
                map: Map::new(),
            }),
            other => Err(FieldError::new(
                path,
                format!("must be a mapping, not {}", type_name(&other)),
            )),
        }
    }

    pub fn path_of(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The raw value of a field; null counts as absent.
    pub fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    pub fn str(&mut self, key: &str) -> Result<Option<String>> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong(key, "a string", &other)),
        }
    }

    pub fn bool(&mut self, key: &str) -> Result<Option<bool>> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(other) => Err(self.wrong(key, "true or false", &other)),
        }
    }

    /// A whole number in `range`; Calico writes some of them as strings ("64512").
    pub fn uint(&mut self, key: &str, max: u64) -> Result<Option<u64>> {
        let path = self.path_of(key);
        let n = match self.take(key) {
            None => return Ok(None),
            Some(Value::Number(n)) => n.as_u64(),
            Some(Value::String(s)) => s.trim().parse::<u64>().ok(),
            Some(other) => return Err(self.wrong(key, "a whole number", &other)),
        };
        match n {
            Some(n) if n <= max => Ok(Some(n)),
            _ => Err(FieldError::new(
                path,
                format!("must be a whole number 0-{max}"),
            )),
        }
    }

    /// One of `allowed` (Calico's spelling); anything else is refused, listing them.
    pub fn choice(&mut self, key: &str, allowed: &[&'static str]) -> Result<Option<&'static str>> {
        let path = self.path_of(key);
        let Some(s) = self.str(key)? else {
            return Ok(None);
        };
        allowed
            .iter()
            .find(|a| **a == s)
            .copied()
            .map(Some)
            .ok_or_else(|| {
                FieldError::new(
                    path,
                    format!("unknown value {s:?}: one of {}", allowed.join(", ")),
                )
            })
    }

    pub fn obj(&mut self, key: &str) -> Result<Option<Obj>> {
        let path = self.path_of(key);
        self.take(key).map(|v| Obj::new(&path, v)).transpose()
    }

    pub fn list(&mut self, key: &str) -> Result<Option<Vec<Value>>> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(other) => Err(self.wrong(key, "a list", &other)),
        }
    }

    /// A field margay knows but does not support: refused with why, whatever its value
    /// (except the values in `harmless`, which ask for what margay does anyway).
    pub fn refuse(&mut self, key: &str, why: &str, harmless: &[Value]) -> Result<()> {
        match self.take(key) {
            Some(v) if !harmless.contains(&v) => Err(FieldError::new(self.path_of(key), why)),
            _ => Ok(()),
        }
    }

    /// Every field not taken is unknown.
    pub fn finish(self) -> Result<()> {
        match self.map.into_iter().find(|(_, v)| !v.is_null()) {
            Some((k, _)) => {
                let path = if self.path.is_empty() {
                    k
                } else {
                    format!("{}.{k}", self.path)
                };
                Err(FieldError::new(path, "unknown field"))
            }
            None => Ok(()),
        }
    }

    fn wrong(&self, key: &str, want: &str, got: &Value) -> FieldError {
        FieldError::new(
            self.path_of(key),
            format!("must be {want}, not {}", type_name(got)),
        )
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// A Go duration as Calico writes them ("90s", "1m30s", "2h"), in whole seconds.
pub fn duration_s(path: &str, s: &str) -> Result<u64> {
    let bad = || {
        FieldError::new(
            path,
            format!("{s:?} is not a duration like \"30s\" or \"1m30s\""),
        )
    };
    let (mut total, mut num) = (0u64, String::new());
    let mut any = false;
    for c in s.trim().chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return Err(bad()),
        };
        let n: u64 = num.parse().map_err(|_| bad())?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
        num.clear();
        any = true;
    }
    if !num.is_empty() || !any {
        return Err(bad());
    }
    Ok(total)
}

/// The Calico spelling of a duration in seconds.
pub fn duration_text(s: u32) -> String {
    format!("{s}s")
}

/// An AS number, as Calico accepts them: a whole number or asdot "1.10" (1 × 65536 + 10).
pub fn as_number(path: &str, v: Value) -> Result<u32> {
    let bad = || {
        FieldError::new(
            path,
            "must be an AS number 1-4294967295 (or asdot, e.g. 1.10)",
        )
    };
    let n = match v {
        Value::Number(n) => n.as_u64().ok_or_else(bad)?,
        Value::String(s) => match s.trim().split_once('.') {
            Some((hi, lo)) => {
                let hi: u64 = hi.parse().map_err(|_| bad())?;
                let lo: u64 = lo.parse().map_err(|_| bad())?;
                if hi > 65535 || lo > 65535 {
                    return Err(bad());
                }
                hi * 65536 + lo
            }
            None => s.trim().parse().map_err(|_| bad())?,
        },
        _ => return Err(bad()),
    };
    match u32::try_from(n) {
        Ok(n) if n != 0 => Ok(n),
        _ => Err(bad()),
    }
}
