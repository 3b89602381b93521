//! The writes of one IPAM operation as steps on single objects, in the order Calico makes
//! them (a claim: affinity pending, then the block, then the affinity confirmed; an
//! allocation: the handle, then the block; a release the other way round). One description
//! serves both ways of writing them (sans-IO here; the allocator runs them):
//!
//! - on a store with the `Atomic` extension, [`merge`] folds the steps into one transaction:
//!   each object written once with its last value, conditional on the version read before
//!   its first step (an affinity created pending and then confirmed is created confirmed);
//! - on any store, the steps run one at a time, each compare-and-swap on the version read or
//!   on the version its previous step wrote. A crash or a lost race between two steps leaves
//!   what the earlier steps wrote, which the order keeps harmless: a pending affinity without
//!   its block, a handle that records more than its blocks hold, an affinity pending
//!   deletion. `ipam check` reports each, and GC (or the node's next claim) finishes it.

use datastore::Version;
use datastore::contract::Op;

/// The version a step's write is conditional on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// The object must not exist (a create).
    Absent,
    /// The object must be at the version the operation read.
    Read(Version),
    /// The object must be as an earlier step of the same operation wrote it.
    Previous,
}

/// One write of an IPAM operation, to the object stored at `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Put {
        key: String,
        value: Vec<u8>,
        expected: Expected,
    },
    Delete {
        key: String,
        expected: Expected,
    },
}

impl Step {
    pub fn key(&self) -> &str {
        match self {
            Step::Put { key, .. } | Step::Delete { key, .. } => key,
        }
    }

    pub fn expected(&self) -> Expected {
        match self {
            Step::Put { expected, .. } | Step::Delete { expected, .. } => *expected,
        }
    }
}

/// Why steps cannot be merged: a step that follows no earlier step of its object claims to,
/// or one that follows one does not (a bug of the operation that made them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the steps of an IPAM operation are not in order at {key}: {reason}")]
pub struct OutOfOrder {
    pub key: String,
    pub reason: &'static str,
}

/// The steps as one transaction: per object (in the order of their first steps) the last
/// write, conditional on what the first step expected. An object created and then deleted
/// by the same steps is left out.
pub fn merge(steps: &[Step]) -> Result<Vec<Op>, OutOfOrder> {
    // (key, expected by the first step, the last step)
    let mut objects: Vec<(&str, Expected, &Step)> = Vec::new();
    for step in steps {
        let key = step.key();
        match objects.iter_mut().find(|(k, _, _)| *k == key) {
            None if step.expected() == Expected::Previous => {
                return Err(OutOfOrder {
                    key: key.to_owned(),
                    reason: "it follows no earlier step",
                });
            }
            None => objects.push((key, step.expected(), step)),
            Some(_) if step.expected() != Expected::Previous => {
                return Err(OutOfOrder {
                    key: key.to_owned(),
                    reason: "a later step does not follow the earlier one",
                });
            }
            Some((_, _, last)) => *last = step,
        }
    }
    Ok(objects
        .into_iter()
        .filter_map(|(key, first, last)| {
            let key = key.to_owned();
            match (first, last) {
                (Expected::Absent, Step::Put { value, .. }) => Some(Op::Create {
                    key,
                    value: value.clone(),
                }),
                (Expected::Read(expected), Step::Put { value, .. }) => Some(Op::Update {
                    key,
                    value: value.clone(),
                    expected,
                }),
                (Expected::Read(expected), Step::Delete { .. }) => {
                    Some(Op::Delete { key, expected })
                }
                // Created and deleted again: nothing to write.
                (Expected::Absent, Step::Delete { .. }) => None,
                (Expected::Previous, _) => None,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: u64) -> Version {
        Version::from_wire(n)
    }

    fn put(key: &str, value: u8, expected: Expected) -> Step {
        Step::Put {
            key: key.into(),
            value: vec![value],
            expected,
        }
    }

    /// A claim with its first address: affinity pending, block, affinity confirmed, handle,
    /// block with the address: one create of each, with the last values.
    #[test]
    fn a_claim_merges_into_one_create_per_object() {
        let steps = [
            put("aff", 1, Expected::Absent),
            put("block", 1, Expected::Absent),
            put("aff", 2, Expected::Previous),
            put("handle", 1, Expected::Read(v(7))),
            put("block", 2, Expected::Previous),
        ];
        assert_eq!(
            merge(&steps).unwrap(),
            vec![
                Op::Create {
                    key: "aff".into(),
                    value: vec![2]
                },
                Op::Create {
                    key: "block".into(),
                    value: vec![2]
                },
                Op::Update {
                    key: "handle".into(),
                    value: vec![1],
                    expected: v(7)
                },
            ]
        );
    }

    /// A block's release: affinity pending deletion, block deleted, affinity deleted: two
    /// deletes on the versions read.
    #[test]
    fn a_release_merges_into_deletes_on_the_versions_read() {
        let steps = [
            put("aff", 3, Expected::Read(v(4))),
            Step::Delete {
                key: "block".into(),
                expected: Expected::Read(v(5)),
            },
            Step::Delete {
                key: "aff".into(),
                expected: Expected::Previous,
            },
        ];
        assert_eq!(
            merge(&steps).unwrap(),
            vec![
                Op::Delete {
                    key: "aff".into(),
                    expected: v(4)
                },
                Op::Delete {
                    key: "block".into(),
                    expected: v(5)
                },
            ]
        );
        // Created and deleted by the same steps: nothing.
        let gone = [
            put("x", 1, Expected::Absent),
            Step::Delete {
                key: "x".into(),
                expected: Expected::Previous,
            },
        ];
        assert_eq!(merge(&gone).unwrap(), vec![]);
    }

    #[test]
    fn steps_out_of_order_are_refused() {
        assert!(merge(&[put("a", 1, Expected::Previous)]).is_err());
        assert!(merge(&[put("a", 1, Expected::Absent), put("a", 2, Expected::Absent)]).is_err());
    }
}
