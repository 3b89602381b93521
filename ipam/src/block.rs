//! Blocks, affinities and handles, and the allocation logic on one block. Everything here is
//! sans-IO: a `Block` is changed in memory and written back by the caller with a
//! compare-and-swap on the revision it was read at.
//!
//! A block is a pool's sub-range (a /26 by default) affine to at most one node. Its free
//! addresses form a FIFO: allocation takes from the head, release appends to the tail, so the
//! address freed longest ago is reused first. Every write bumps the block's sequence number,
//! and each allocation records the sequence number it was made at: a release that names an
//! older one is stale (the address has been reused) and frees nothing.

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use datastore::resource::Resource;

/// One allocated address of a block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    pub handle: String,
    /// The node the address was allocated for (differs from the block's affinity when borrowed).
    pub node: String,
    /// The block's sequence number when this allocation was made.
    pub seq: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attrs: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    pub cidr: IpNet,
    pub pool: String,
    /// The node the block is affine to.
    pub affinity: Option<String>,
    /// Bumped on every write.
    pub seq: u64,
    /// Allocated ordinals.
    pub slots: BTreeMap<u32, Slot>,
    /// Free ordinals, oldest freed first.
    pub free: VecDeque<u32>,
    /// Unix seconds when the block last became empty; `None` while it holds addresses.
    pub emptied_at: Option<u64>,
}

impl Resource for Block {
    const KIND: &'static str = "IPAMBlock";
    const SCHEMA: u32 = 1;
    const PREFIX: &'static str = "/margay/v1/ipam/blocks/";
}

/// The key-safe form of a CIDR: '/' becomes '-' ("172.20.0.64-26").
pub fn cidr_key(cidr: &IpNet) -> String {
    cidr.to_string().replace('/', "-")
}

/// The CIDR of a block's or an affinity's key (the inverse of [`cidr_key`] on the key's last
/// part), without reading the value; `None` for a key of another shape.
pub fn cidr_of_key(key: &str) -> Option<IpNet> {
    let last = key.rsplit('/').next()?;
    let (addr, len) = last.rsplit_once('-')?;
    format!("{addr}/{len}").parse().ok()
}

/// What a release of one address did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// Freed; the handle that held it.
    Freed { handle: String },
    /// It was not allocated: nothing to do.
    AlreadyFree,
    /// The guard did not match: the address now belongs to someone else.
    Stale,
}

impl Block {
    /// A new, empty block.
    pub fn new(cidr: IpNet, pool: &str, affinity: Option<&str>, now: u64) -> Self {
        let size = 1u64 << (cidr.max_prefix_len() - cidr.prefix_len());
        Self {
            cidr,
            pool: pool.into(),
            affinity: affinity.map(Into::into),
            seq: 0,
            slots: BTreeMap::new(),
            free: (0..size as u32).collect(),
            emptied_at: Some(now),
        }
    }

    /// Whether the block is one of `pool`'s: by the pool it records, or, for a block written
    /// without one (Calico's blocks record no pool: the pool is the one whose range holds the
    /// block), by the pool's range.
    pub fn in_pool(&self, pool: &datastore::model::IpPool) -> bool {
        if self.pool.is_empty() {
            pool.cidr.contains(&self.cidr.network())
        } else {
            self.pool == pool.name
        }
    }

    pub fn size(&self) -> u32 {
        1u32 << (self.cidr.max_prefix_len() - self.cidr.prefix_len()).min(31)
    }

    pub fn used(&self) -> u32 {
        self.slots.len() as u32
    }

    pub fn free_count(&self) -> u32 {
        self.free.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Addresses allocated for nodes other than the affine one.
    pub fn borrowed(&self) -> u32 {
        self.slots
            .values()
            .filter(|s| Some(&s.node) != self.affinity.as_ref())
            .count() as u32
    }

    /// The address of `ordinal`; one past the block's end (a damaged block's ordinal) wraps
    /// instead of panicking: `check` reports such ordinals.
    pub fn address(&self, ordinal: u32) -> IpAddr {
        match self.cidr {
            IpNet::V4(n) => IpAddr::V4(u32::from(n.network()).wrapping_add(ordinal).into()),
            IpNet::V6(n) => IpAddr::V6(
                u128::from(n.network())
                    .wrapping_add(u128::from(ordinal))
                    .into(),
            ),
        }
    }

    pub fn ordinal(&self, addr: IpAddr) -> Option<u32> {
        if !self.cidr.contains(&addr) {
            return None;
        }
        let offset = match (self.cidr, addr) {
            (IpNet::V4(n), IpAddr::V4(a)) => (u32::from(a) - u32::from(n.network())) as u128,
            (IpNet::V6(n), IpAddr::V6(a)) => u128::from(a) - u128::from(n.network()),
            _ => return None,
        };
        u32::try_from(offset).ok()
    }

    /// Takes up to `n` free addresses for `handle`, oldest freed first.
    pub fn allocate(
        &mut self,
        n: usize,
        handle: &str,
        node: &str,
        attrs: &BTreeMap<String, String>,
    ) -> Vec<(IpAddr, u64)> {
        let mut out = Vec::new();
        if n == 0 || self.free.is_empty() {
            return out;
        }
        self.seq += 1;
        while out.len() < n {
            let Some(ordinal) = self.free.pop_front() else {
                break;
            };
            // A damaged block may list an allocated ordinal as free too (`check` reports
            // it): it was never free, and goes from the list rather than to a second pod.
            if self.slots.contains_key(&ordinal) {
                continue;
            }
            self.slots.insert(
                ordinal,
                Slot {
                    handle: handle.into(),
                    node: node.into(),
                    seq: self.seq,
                    attrs: attrs.clone(),
                },
            );
            out.push((self.address(ordinal), self.seq));
        }
        self.emptied_at = None;
        out
    }

    /// Takes one given address; `false` if it is not free.
    pub fn allocate_addr(
        &mut self,
        addr: IpAddr,
        handle: &str,
        node: &str,
        attrs: &BTreeMap<String, String>,
    ) -> Option<u64> {
        let ordinal = self.ordinal(addr)?;
        let pos = self.free.iter().position(|&o| o == ordinal)?;
        self.free.remove(pos);
        self.seq += 1;
        self.slots.insert(
            ordinal,
            Slot {
                handle: handle.into(),
                node: node.into(),
                seq: self.seq,
                attrs: attrs.clone(),
            },
        );
        self.emptied_at = None;
        Some(self.seq)
    }

    /// Frees `addr` if allocated and the guards (handle, sequence number) match.
    pub fn release(
        &mut self,
        addr: IpAddr,
        handle: Option<&str>,
        seq: Option<u64>,
        now: u64,
    ) -> Released {
        let Some(ordinal) = self.ordinal(addr) else {
            return Released::AlreadyFree;
        };
        let Some(slot) = self.slots.get(&ordinal) else {
            return Released::AlreadyFree;
        };
        if handle.is_some_and(|h| h != slot.handle) || seq.is_some_and(|s| s != slot.seq) {
            return Released::Stale;
        }
        let slot = self.slots.remove(&ordinal).expect("checked above");
        self.free.push_back(ordinal);
        self.seq += 1;
        if self.slots.is_empty() {
            self.emptied_at = Some(now);
        }
        Released::Freed {
            handle: slot.handle,
        }
    }

    /// Every allocation of `handle` in this block: (address, sequence number).
    pub fn of_handle<'a>(
        &'a self,
        handle: &'a str,
    ) -> impl Iterator<Item = (IpAddr, &'a Slot)> + 'a {
        self.slots
            .iter()
            .filter(move |(_, s)| s.handle == handle)
            .map(|(&o, s)| (self.address(o), s))
    }
}

/// The state of a node's claim on a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AffinityState {
    /// Claim under way: the block may not exist yet; never used nor advertised.
    Pending,
    /// The block is the node's: used for allocation and advertised.
    Confirmed,
    /// Release under way: no longer used for allocation nor advertised.
    PendingDeletion,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockAffinity {
    pub node: String,
    pub cidr: IpNet,
    pub state: AffinityState,
}

impl Resource for BlockAffinity {
    const KIND: &'static str = "BlockAffinity";
    const SCHEMA: u32 = 1;
    const PREFIX: &'static str = "/margay/v1/ipam/affinities/";
}

impl BlockAffinity {
    /// `/margay/v1/ipam/affinities/<node>/<cidr>`: one node's affinities share a prefix.
    pub fn key_of(node: &str, cidr: &IpNet) -> String {
        format!("{}{node}/{}", Self::PREFIX, cidr_key(cidr))
    }

    pub fn prefix_of(node: &str) -> String {
        format!("{}{node}/", Self::PREFIX)
    }
}

/// The index from a handle to its blocks, so release by handle need not scan every block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handle {
    pub id: String,
    /// Block CIDR → addresses held there.
    pub blocks: BTreeMap<String, u32>,
}

impl Resource for Handle {
    const KIND: &'static str = "IPAMHandle";
    const SCHEMA: u32 = 1;
    const PREFIX: &'static str = "/margay/v1/ipam/handles/";
}

impl Handle {
    pub fn total(&self) -> u32 {
        self.blocks.values().sum()
    }

    pub fn add(&mut self, block: &IpNet, n: u32) {
        *self.blocks.entry(block.to_string()).or_default() += n;
    }

    pub fn remove(&mut self, block: &IpNet, n: u32) {
        let key = block.to_string();
        if let Some(count) = self.blocks.get_mut(&key) {
            *count = count.saturating_sub(n);
            if *count == 0 {
                self.blocks.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_give_their_cidr_back() {
        for c in ["172.20.0.64/26", "fd00:20::c0/122", "10.0.0.0/8"] {
            let cidr: IpNet = c.parse().unwrap();
            assert_eq!(cidr_of_key(&Block::key(&cidr_key(&cidr))), Some(cidr));
            assert_eq!(
                cidr_of_key(&BlockAffinity::key_of("node-1", &cidr)),
                Some(cidr)
            );
        }
        assert_eq!(cidr_of_key("/margay/v1/ipam/blocks/nonsense"), None);
        assert_eq!(cidr_of_key("/margay/v1/ipam/blocks/10.0.0.0-99"), None);
    }

    fn block() -> Block {
        Block::new("10.0.0.0/30".parse().unwrap(), "p", Some("n1"), 0)
    }

    #[test]
    fn an_allocated_address_listed_free_by_damage_is_never_handed_out_again() {
        let mut b = block();
        let attrs = BTreeMap::new();
        let first = b.allocate(1, "h1", "n1", &attrs)[0].0;
        b.free.push_front(0);
        let next: Vec<IpAddr> = b
            .allocate(3, "h2", "n1", &attrs)
            .iter()
            .map(|(a, _)| *a)
            .collect();
        assert!(!next.contains(&first), "{first} handed out twice");
        assert_eq!(next.len(), 3);
        assert_eq!(b.slots[&0].handle, "h1");
        assert!(b.free.is_empty());
    }

    #[test]
    fn allocation_takes_in_order_and_release_reuses_oldest_freed_first() {
        let mut b = block();
        let attrs = BTreeMap::new();
        let got: Vec<String> = b
            .allocate(4, "h", "n1", &attrs)
            .iter()
            .map(|(a, _)| a.to_string())
            .collect();
        assert_eq!(got, ["10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        assert!(b.allocate(1, "h", "n1", &attrs).is_empty());
        assert_eq!(
            b.release("10.0.0.2".parse().unwrap(), None, None, 5),
            Released::Freed { handle: "h".into() }
        );
        assert_eq!(
            b.release("10.0.0.0".parse().unwrap(), None, None, 5),
            Released::Freed { handle: "h".into() }
        );
        assert_eq!(
            b.release("10.0.0.0".parse().unwrap(), None, None, 5),
            Released::AlreadyFree
        );
        let again: Vec<String> = b
            .allocate(2, "g", "n1", &attrs)
            .iter()
            .map(|(a, _)| a.to_string())
            .collect();
        assert_eq!(again, ["10.0.0.2", "10.0.0.0"]);
    }

    #[test]
    fn a_stale_release_frees_nothing() {
        let mut b = block();
        let attrs = BTreeMap::new();
        let a: IpAddr = "10.0.0.0".parse().unwrap();
        let (_, old_seq) = b.allocate(1, "pod-1", "n1", &attrs)[0];
        b.release(a, Some("pod-1"), Some(old_seq), 1);
        // Allocate everything so the address is reused by another pod.
        let reused = b.allocate(4, "pod-2", "n1", &attrs);
        assert!(reused.iter().any(|(x, _)| *x == a));
        assert_eq!(b.release(a, Some("pod-1"), None, 2), Released::Stale);
        assert_eq!(b.release(a, None, Some(old_seq), 2), Released::Stale);
        assert_eq!(b.used(), 4);
    }

    #[test]
    fn borrowed_counts_other_nodes() {
        let mut b = block();
        let attrs = BTreeMap::new();
        b.allocate(1, "h1", "n1", &attrs);
        b.allocate(2, "h2", "n2", &attrs);
        assert_eq!(b.borrowed(), 2);
        assert_eq!(b.of_handle("h2").count(), 2);
    }

    #[test]
    fn ipv6_ordinals() {
        let b = Block::new("fd00::40/122".parse().unwrap(), "p", None, 0);
        assert_eq!(b.size(), 64);
        assert_eq!(b.address(3).to_string(), "fd00::43");
        assert_eq!(b.ordinal("fd00::7f".parse().unwrap()), Some(63));
        assert_eq!(b.ordinal("fd00::80".parse().unwrap()), None);
    }
}
