//! Walking a JSON document field by field: each object remembers which of its keys were
//! read, so a key nobody read is an unknown field, refused with its path. Paths read as the
//! user wrote them: `spec.ingress[0].from[1].ipBlock.except[0]`.

use std::cell::RefCell;
use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::FieldError;

/// One value and where it sits in the document.
pub(crate) struct Field<'a> {
    pub value: &'a Value,
    pub path: String,
}

impl<'a> Field<'a> {
    pub fn root(value: &'a Value) -> Field<'a> {
        Field {
            value,
            path: String::new(),
        }
    }

    pub fn error(&self, reason: impl Into<String>) -> FieldError {
        FieldError {
            path: self.path.clone(),
            reason: reason.into(),
        }
    }

    pub fn object(&self) -> Result<Object<'a>, FieldError> {
        match self.value {
            Value::Object(map) => Ok(Object {
                path: self.path.clone(),
                map,
                read: RefCell::new(Vec::new()),
            }),
            _ => Err(self.error("must be an object")),
        }
    }

    pub fn str(&self) -> Result<&'a str, FieldError> {
        self.value
            .as_str()
            .ok_or_else(|| self.error("must be a string"))
    }

    pub fn bool(&self) -> Result<bool, FieldError> {
        self.value
            .as_bool()
            .ok_or_else(|| self.error("must be true or false"))
    }

    pub fn f64(&self) -> Result<f64, FieldError> {
        self.value
            .as_f64()
            .ok_or_else(|| self.error("must be a number"))
    }

    /// An integer in `lo..=hi`.
    pub fn int(&self, lo: i64, hi: i64) -> Result<i64, FieldError> {
        match self.value.as_i64() {
            Some(n) if (lo..=hi).contains(&n) => Ok(n),
            None if !self.value.is_number() => Err(self.error("must be an integer")),
            _ => Err(self.error(format!(
                "{} is out of range: use an integer from {lo} to {hi}",
                self.value
            ))),
        }
    }

    /// The list's elements, each with its own path.
    pub fn items(&self) -> Result<Vec<Field<'a>>, FieldError> {
        let items = self
            .value
            .as_array()
            .ok_or_else(|| self.error("must be a list"))?;
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, value)| Field {
                value,
                path: format!("{}[{i}]", self.path),
            })
            .collect())
    }

    pub fn each<T>(
        &self,
        f: impl FnMut(Field<'a>) -> Result<T, FieldError>,
    ) -> Result<Vec<T>, FieldError> {
        self.items()?.into_iter().map(f).collect()
    }

    pub fn strings(&self) -> Result<Vec<String>, FieldError> {
        self.each(|f| f.str().map(str::to_owned))
    }

    /// A map of strings to strings (labels, annotations).
    pub fn string_map(&self) -> Result<BTreeMap<String, String>, FieldError> {
        let map = self
            .value
            .as_object()
            .ok_or_else(|| self.error("must be a map of strings"))?;
        map.iter()
            .map(|(k, value)| match value.as_str() {
                Some(v) => Ok((k.clone(), v.to_owned())),
                None => Err(FieldError {
                    path: join(&self.path, k),
                    reason: "must be a string".into(),
                }),
            })
            .collect()
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// An object being read; `finish` refuses the keys that were not.
pub(crate) struct Object<'a> {
    path: String,
    map: &'a Map<String, Value>,
    read: RefCell<Vec<&'static str>>,
}

impl<'a> Object<'a> {
    /// The field, if present and not null (YAML's empty value means absent).
    pub fn get(&self, key: &'static str) -> Option<Field<'a>> {
        self.read.borrow_mut().push(key);
        match self.map.get(key) {
            None | Some(Value::Null) => None,
            Some(value) => Some(Field {
                value,
                path: join(&self.path, key),
            }),
        }
    }

    pub fn required(&self, key: &'static str) -> Result<Field<'a>, FieldError> {
        self.get(key).ok_or_else(|| FieldError {
            path: join(&self.path, key),
            reason: "is required".into(),
        })
    }

    /// Marks keys as known without reading them (read-only metadata).
    pub fn ignore(&self, keys: &[&'static str]) {
        self.read.borrow_mut().extend_from_slice(keys);
    }

    pub fn path_of(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub fn finish(&self) -> Result<(), FieldError> {
        let mut known = self.read.borrow().clone();
        match self.map.keys().find(|k| !known.contains(&k.as_str())) {
            None => Ok(()),
            Some(unknown) => {
                known.sort_unstable();
                known.dedup();
                Err(FieldError {
                    path: join(&self.path, unknown),
                    reason: format!("unknown field; this object takes {}", known.join(", ")),
                })
            }
        }
    }
}
