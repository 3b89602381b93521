//! YAML text ⇄ `serde_json::Value`, so that one tree type serves both `-o yaml` and `-o json`
//! and the mapping code walks a single representation.
//!
//! The crate is yaml-rust2: maintained (serde_yaml is archived), pure Rust, YAML 1.2, with
//! multi-document streams (`---`) natively and an emitter, and it hands back a plain tree —
//! which is what we want, because bgpctl walks the tree itself to name every unknown or
//! unsupported field by its path (a serde derive would stop at the first unknown field with
//! a message we do not control). serde-saphyr was the other candidate; it is serde-only.

use serde_json::{Map, Number, Value};
use yaml_rust2::yaml::Hash;
use yaml_rust2::{Yaml, YamlEmitter, YamlLoader};

/// The documents of a YAML stream, as JSON values. Empty documents are dropped.
pub fn parse_stream(text: &str) -> Result<Vec<Value>, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| format!("not valid YAML: {e}"))?;
    docs.iter()
        .filter(|d| !matches!(d, Yaml::Null))
        .map(|d| to_json(d, ""))
        .collect()
}

fn to_json(y: &Yaml, path: &str) -> Result<Value, String> {
    let at = |p: &str| {
        if p.is_empty() {
            "(top)".to_owned()
        } else {
            p.to_owned()
        }
    };
    Ok(match y {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Integer(i) => Value::Number((*i).into()),
        Yaml::Real(r) => r
            .parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map(Value::Number)
            .ok_or_else(|| format!("{}: {r:?} is not a number", at(path)))?,
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Array(a) => Value::Array(
            a.iter()
                .enumerate()
                .map(|(i, v)| to_json(v, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        Yaml::Hash(h) => {
            let mut m = Map::new();
            for (k, v) in h {
                let Yaml::String(key) = k else {
                    return Err(format!("{}: keys must be strings, not {k:?}", at(path)));
                };
                let p = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                if m.insert(key.clone(), to_json(v, &p)?).is_some() {
                    return Err(format!("{p}: given twice"));
                }
            }
            Value::Object(m)
        }
        Yaml::Alias(_) | Yaml::BadValue => {
            return Err(format!("{}: aliases are not supported", at(path)));
        }
    })
}

fn to_yaml(v: &Value) -> Yaml {
    match v {
        Value::Null => Yaml::Null,
        Value::Bool(b) => Yaml::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Yaml::Integer(i),
            None => Yaml::Real(n.to_string()),
        },
        Value::String(s) => Yaml::String(s.clone()),
        Value::Array(a) => Yaml::Array(a.iter().map(to_yaml).collect()),
        Value::Object(m) => {
            let mut h = Hash::new();
            for (k, v) in m {
                h.insert(Yaml::String(k.clone()), to_yaml(v));
            }
            Yaml::Hash(h)
        }
    }
}

/// One YAML document (starting with `---`), ending with a newline.
pub fn emit(v: &Value) -> Result<String, String> {
    let mut out = String::new();
    YamlEmitter::new(&mut out)
        .dump(&to_yaml(v))
        .map_err(|e| format!("cannot write YAML: {e:?}"))?;
    out.push('\n');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn multi_document_streams_and_round_trip() {
        let docs = parse_stream("---\na: 1\n---\n# nothing\n---\nb: [x, \"fd00::/48\"]\n").unwrap();
        assert_eq!(
            docs,
            vec![json!({"a": 1}), json!({"b": ["x", "fd00::/48"]})]
        );
        let v =
            json!({"cidr": "fd00::/48", "n": 26, "on": true, "sel": "all()", "l": {"a/b": "c"}});
        assert_eq!(parse_stream(&emit(&v).unwrap()).unwrap(), vec![v]);
    }

    #[test]
    fn bad_yaml_is_refused_with_a_reason() {
        assert!(
            parse_stream("a: [1, 2\n")
                .unwrap_err()
                .contains("not valid YAML")
        );
        assert!(
            parse_stream("a:\n  b: 1\n  b: 2\n")
                .unwrap_err()
                .contains("duplicated key")
        );
        assert!(
            parse_stream("a:\n  1: x\n")
                .unwrap_err()
                .starts_with("a: keys")
        );
    }
}
