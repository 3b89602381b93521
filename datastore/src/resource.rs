//! How typed resources are stored: a JSON envelope `{"schema": N, "spec": {...}}` around the
//! serde encoding of the resource, so a later margay can recognise and migrate what an earlier
//! one wrote, and an earlier one refuses what it cannot read instead of misreading it.
//! [`Resources`] reads and writes them through the core contract, one object at a time.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::contract::{Datastore, Kind, StoreError, Version};
pub use crate::error::DecodeError;
use crate::error::ResourceError;

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

/// Typed resources over the core contract: each call is one object's get, list or
/// compare-and-swap write, so it works the same on every backend.
pub struct Resources<'a, D> {
    store: &'a D,
}

impl<'a, D: Datastore> Resources<'a, D> {
    pub fn new(store: &'a D) -> Self {
        Resources { store }
    }

    /// The resource named `name` and its version, if it exists.
    pub async fn get<T: Resource>(
        &self,
        name: &str,
    ) -> Result<Option<(T, Version)>, ResourceError> {
        match self.store.get(T::kind(), name).await? {
            Some(o) => Ok(Some((decode(&o.value)?, o.version))),
            None => Ok(None),
        }
    }

    /// Every resource of the kind whose name starts with `name_prefix` ("" for all), by name.
    pub async fn list<T: Resource>(
        &self,
        name_prefix: &str,
    ) -> Result<Vec<(T, Version)>, ResourceError> {
        let list = self.store.list(T::kind(), name_prefix).await?;
        list.items
            .into_iter()
            .map(|o| Ok((decode(&o.value)?, o.version)))
            .collect()
    }

    /// Writes the resource: created when `expected` is `None` (`AlreadyExists` if it is
    /// there), else replaced if still at `expected` (`Stale` otherwise). Returns its version.
    pub async fn put<T: Resource>(
        &self,
        name: &str,
        resource: &T,
        expected: Option<Version>,
    ) -> Result<Version, ResourceError> {
        let value = encode(resource);
        let written = match expected {
            None => self.store.create(T::kind(), name, value).await,
            Some(v) => self.store.update(T::kind(), name, value, v).await,
        };
        written.map_err(|e| lost_race::<T>(e, name, expected))
    }

    /// Deletes the resource if still at `expected` (`Stale` otherwise).
    pub async fn delete<T: Resource>(
        &self,
        name: &str,
        expected: Version,
    ) -> Result<(), ResourceError> {
        self.store
            .delete(T::kind(), name, expected)
            .await
            .map_err(|e| lost_race::<T>(e, name, Some(expected)))
    }
}

/// A lost compare-and-swap in the words of the caller's intent.
fn lost_race<T: Resource>(e: StoreError, name: &str, expected: Option<Version>) -> ResourceError {
    match (e, expected) {
        (StoreError::Conflict { .. }, None) => {
            ResourceError::AlreadyExists(format!("{} {name}", T::KIND))
        }
        (StoreError::Conflict { .. }, Some(_)) => {
            ResourceError::Stale(format!("{} {name}", T::KIND))
        }
        (e, _) => e.into(),
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
