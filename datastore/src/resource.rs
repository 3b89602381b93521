//! How typed resources are stored: a JSON envelope `{"schema": N, "spec": {...}}` around the
//! serde encoding of the resource, so a later margay can recognise and migrate what an earlier
//! one wrote, and an earlier one refuses what it cannot read instead of misreading it.
//! (`crate::resources` reads and writes them through the core contract.)

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::contract::Kind;
pub use crate::error::DecodeError;

/// A kind of resource kept in the datastore.
pub trait Resource: Serialize + DeserializeOwned {
    /// The kind's name, used in keys and messages, e.g. "IPPool".
    const KIND: &'static str;
    /// The schema version this build writes.
    const SCHEMA: u32;
    /// Where resources of this kind live, e.g. "/margay/v1/ippools/".
    const PREFIX: &'static str;

    /// Converts the spec of an older schema into this one. By default older schemas are
    /// refused; a kind overrides this when its schema changes.
    fn migrate(schema: u32, spec: serde_json::Value) -> Result<Self, DecodeError> {
        let _ = spec;
        Err(DecodeError::Schema {
            kind: Self::KIND,
            found: schema,
            known: Self::SCHEMA,
        })
    }

    /// The full key of the resource named `name` (in the key-value backends).
    fn key(name: &str) -> String {
        format!("{}{}", Self::PREFIX, name)
    }

    /// The kind as the datastore contract names it.
    fn kind() -> Kind {
        Kind::new(Self::KIND, Self::PREFIX)
    }
}

#[derive(Serialize)]
struct EnvelopeOut<'a, T> {
    schema: u32,
    spec: &'a T,
}

#[derive(serde::Deserialize)]
struct EnvelopeIn {
    schema: u32,
    spec: serde_json::Value,
}

/// The stored bytes of a resource.
pub fn encode<T: Resource>(resource: &T) -> Vec<u8> {
    serde_json::to_vec(&EnvelopeOut {
        schema: T::SCHEMA,
        spec: resource,
    })
    .expect("resources serialise to JSON: maps have string keys")
}

/// A resource from its stored bytes, migrating older schemas.
pub fn decode<T: Resource>(bytes: &[u8]) -> Result<T, DecodeError> {
    let malformed = |e: serde_json::Error| DecodeError::Malformed {
        kind: T::KIND,
        reason: e.to_string(),
    };
    let envelope: EnvelopeIn = serde_json::from_slice(bytes).map_err(malformed)?;
    match envelope.schema.cmp(&T::SCHEMA) {
        std::cmp::Ordering::Equal => serde_json::from_value(envelope.spec).map_err(malformed),
        std::cmp::Ordering::Less => T::migrate(envelope.schema, envelope.spec),
        std::cmp::Ordering::Greater => Err(DecodeError::Schema {
            kind: T::KIND,
            found: envelope.schema,
            known: T::SCHEMA,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Thing {
        name: String,
        size: u32,
    }

    impl Resource for Thing {
        const KIND: &'static str = "Thing";
        const SCHEMA: u32 = 2;
        const PREFIX: &'static str = "/margay/v1/things/";

        fn migrate(schema: u32, spec: serde_json::Value) -> Result<Self, DecodeError> {
            // Schema 1 called `size` `count`.
            match schema {
                1 => Ok(Thing {
                    name: spec["name"].as_str().unwrap_or_default().to_owned(),
                    size: spec["count"].as_u64().unwrap_or_default() as u32,
                }),
                _ => Err(DecodeError::Schema {
                    kind: Self::KIND,
                    found: schema,
                    known: Self::SCHEMA,
                }),
            }
        }
    }

    #[test]
    fn round_trip_carries_the_schema() {
        let t = Thing {
            name: "a".into(),
            size: 3,
        };
        let bytes = encode(&t);
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["schema"], 2);
        assert_eq!(decode::<Thing>(&bytes).unwrap(), t);
        assert_eq!(Thing::key("a"), "/margay/v1/things/a");
    }

    #[test]
    fn older_schemas_migrate_newer_ones_are_refused() {
        let old = br#"{"schema":1,"spec":{"name":"b","count":7}}"#;
        assert_eq!(
            decode::<Thing>(old).unwrap(),
            Thing {
                name: "b".into(),
                size: 7
            }
        );
        let newer = br#"{"schema":3,"spec":{}}"#;
        let err = decode::<Thing>(newer).unwrap_err();
        assert!(err.to_string().contains("upgrade margay"), "{err}");
        assert!(matches!(
            decode::<Thing>(b"not json"),
            Err(DecodeError::Malformed { .. })
        ));
    }
}
