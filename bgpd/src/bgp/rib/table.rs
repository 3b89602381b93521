//! [`PrefixTable`]: the hash table behind the RIB's per-prefix tables (every peer's
//! Adj-RIB-In and the Loc-RIB).
//!
//! A full table is tens of MiB probed at random, and a cache miss per prefix was most of
//! what ingesting one cost. `HashMap` (hashbrown) keeps a control byte per slot in an array
//! apart from the slots, so a new prefix touches two random lines. Here a slot holds the key
//! and its value together: a lookup or an insert touches one line (usually); a pass over a
//! batch of keys fetches their slots ahead ([`PrefixTable::prefetch_for`]) so the misses
//! overlap; and growing reads the old slots in order and writes the new ones nearly in order
//! (a key's home slot is its hash's top bits, so the keys of slot i go to 2i or 2i + 1),
//! where hashbrown's rehash writes every key to a random place. `bgp_bench`, 1M prefixes,
//! eight alternating runs: ingest 0.51 s with `HashMap`, 0.43 s with this table and a whole
//! UPDATE's slots fetched before the pass (5 MiB less at the peak); eight more: 0.46 s that
//! way, 0.31 s with slots fetched a few keys ahead of the pass instead.
//!
//! Linear probing, at most 7/8 full, deletion by shifting back (no tombstones). The key
//! type's `Default` (the default route) marks a vacant slot; that key itself, when stored,
//! is kept beside the slots. Values are small `Copy` types (ids), so slots are plain data.

use std::fmt;

use bgp_wire::{Ipv4Prefix, Ipv6Prefix};

/// Slots of the first allocation (seven keys): a mesh peer's Adj-RIB-In holds four blocks.
const MIN_SLOTS: usize = 8;
/// Below this many keys a batch is not worth a prefetch pass.
const PREFETCH_BATCH: usize = 16;
/// A table of fewer slots stays in the CPU's caches: its probes do not miss.
const PREFETCH_SLOTS: usize = 4096;
/// How many keys ahead of a pass their slots are fetched: more than the misses that take
/// as long as the pass's work on one key. `bgp_bench`, 1M prefixes, alternating runs:
/// 16 cut ingest by a third against fetching a whole UPDATE's slots before the pass
/// (eight of eight runs); 32 was a little faster again (five of eight).
const PREFETCH_AHEAD: usize = 32;

/// A hash table from prefixes (any small `Copy` key whose `Default` may mark vacant slots)
/// to small `Copy` values.
#[derive(Clone)]
pub struct PrefixTable<K, V> {
    /// A power of two long, or empty.
    slots: Box<[(K, V)]>,
    /// 64 - log2(slots.len()): a key's home slot is `hash >> shift`.
    shift: u32,
    /// Keys held in `slots`.
    in_slots: usize,
    /// The entry of `K::default()`, the key that marks vacant slots.
    default_entry: Option<(K, V)>,
}

impl<K, V> Default for PrefixTable<K, V> {
    fn default() -> Self {
        PrefixTable {
            slots: Box::new([]),
            shift: 64,
            in_slots: 0,
            default_entry: None,
        }
    }
}

/// A key of a [`PrefixTable`]: small, compared by value, its `Default` (the default route)
/// free to mark vacant slots, and a hash whose top bits are spread evenly.
pub trait TableKey: Copy + Eq + Default {
    fn table_hash(&self) -> u64;
}

/// Spreads a word over the top bits, which index the table: xor-shifts and multiplications
/// (murmur3's finaliser, less its last step), so every input bit moves the top ones.
/// Sequential prefixes (a table's usual order) must not land in runs.
fn spread(x: u64) -> u64 {
    let h = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    (h ^ (h >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53)
}

impl TableKey for Ipv4Prefix {
    fn table_hash(&self) -> u64 {
        spread((u64::from(self.addr().to_bits()) << 8) | u64::from(self.prefix_len()))
    }
}

impl TableKey for Ipv6Prefix {
    fn table_hash(&self) -> u64 {
        let a = self.addr().to_bits();
        // Both halves count: routed IPv6 prefixes differ in the high one, hosts in the low.
        let folded = spread((a >> 64) as u64) ^ (a as u64);
        spread(folded ^ u64::from(self.prefix_len()))
    }
}

impl<K: TableKey, V: Copy + Default> PrefixTable<K, V> {
    pub fn len(&self) -> usize {
        self.in_slots + usize::from(self.default_entry.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slot a key's probe starts at. Only for a table with slots.
    fn home(&self, hash: u64) -> usize {
        // `shift` < 64 once there are slots; the result is below `slots.len()`.
        (hash >> self.shift) as usize
    }

    /// Where `k` is (`Ok`), or the vacant slot that ends its probe (`Err`: where it would go).
    /// Only for a table with slots and a key that is not the default: the table is never
    /// full, so the probe ends.
    fn find(&self, k: &K) -> Result<usize, usize> {
        let mask = self.slots.len() - 1;
        let vacant = K::default();
        let mut i = self.home(k.table_hash());
        loop {
            let key = &self.slots[i].0;
            if key == k {
                return Ok(i);
            }
            if *key == vacant {
                return Err(i);
            }
            i = (i + 1) & mask;
        }
    }

    pub fn get(&self, k: &K) -> Option<&V> {
        if *k == K::default() {
            return self.default_entry.as_ref().map(|(_, v)| v);
        }
        if self.slots.is_empty() {
            return None;
        }
        let i = self.find(k).ok()?;
        Some(&self.slots[i].1)
    }

    pub fn contains_key(&self, k: &K) -> bool {
        self.get(k).is_some()
    }

    /// Store `v` for `k`; the value it had.
    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        if k == K::default() {
            return self.default_entry.replace((k, v)).map(|(_, old)| old);
        }
        if self.slots.is_empty() {
            self.grow();
        }
        let i = match self.find(&k) {
            Ok(i) => return Some(std::mem::replace(&mut self.slots[i].1, v)),
            Err(_) if (self.in_slots + 1) * 8 > self.slots.len() * 7 => {
                self.grow();
                self.vacant_for(&k)
            }
            Err(i) => i,
        };
        self.slots[i] = (k, v);
        self.in_slots += 1;
        None
    }

    /// Take `k` out; the value it had.
    pub fn remove(&mut self, k: &K) -> Option<V> {
        if *k == K::default() {
            return self.default_entry.take().map(|(_, v)| v);
        }
        if self.slots.is_empty() {
            return None;
        }
        let mut hole = self.find(k).ok()?;
        let old = self.slots[hole].1;
        // Keys after the hole, up to the next vacant slot, may have probed past it: each one
        // whose home is not between the hole and itself moves back into it.
        let mask = self.slots.len() - 1;
        let vacant = K::default();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let key = self.slots[j].0;
            if key == vacant {
                break;
            }
            let from_home = j.wrapping_sub(self.home(key.table_hash())) & mask;
            if from_home >= j.wrapping_sub(hole) & mask {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole] = (vacant, V::default());
        self.in_slots -= 1;
        Some(old)
    }

    /// The vacant slot a key not in the table goes to.
    fn vacant_for(&self, k: &K) -> usize {
        match self.find(k) {
            Ok(i) | Err(i) => i,
        }
    }

    /// Twice the slots (or the first ones), every key moved to its place there.
    #[cold]
    fn grow(&mut self) {
        let n = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(
            &mut self.slots,
            vec![(K::default(), V::default()); n].into_boxed_slice(),
        );
        self.shift = 64 - n.trailing_zeros();
        let vacant = K::default();
        for &(k, v) in old.iter().filter(|(k, _)| *k != vacant) {
            let i = self.vacant_for(&k);
            self.slots[i] = (k, v);
        }
    }

    /// For a pass over `keys`, at `keys[i]`: start loading the slots of the key
    /// [`PREFETCH_AHEAD`] further on (at the start, of the first ones too), so that each is in
    /// cache when the pass reaches it. A big table's probes each miss the cache; this way
    /// the misses of a batch overlap, where the pass, with its inserts and decisions
    /// between two probes, would wait for each in turn.
    pub fn prefetch_for(&self, keys: &[K], i: usize) {
        if keys.len() < PREFETCH_BATCH || self.slots.len() < PREFETCH_SLOTS {
            return;
        }
        // The probe goes on past the home slot (~7 slots on average while a table fills):
        // the line after it too.
        let next = 64 / std::mem::size_of::<(K, V)>().max(1);
        let mask = self.slots.len() - 1;
        let fetch = |k: &K| {
            let home = self.home(k.table_hash());
            prefetch_line(&self.slots[home]);
            prefetch_line(&self.slots[(home + next) & mask]);
        };
        if i == 0 {
            keys.iter().take(PREFETCH_AHEAD).for_each(fetch);
        }
        if let Some(k) = keys.get(i + PREFETCH_AHEAD) {
            fetch(k);
        }
    }

    pub fn iter(&self) -> Iter<'_, K, V> {
        self.into_iter()
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.iter().map(|(k, _)| k)
    }
}

#[cfg(target_arch = "x86_64")]
fn prefetch_line<T>(p: &T) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // A hint: it reads nothing the program sees and cannot fault.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(p).cast()) }
}

#[cfg(not(target_arch = "x86_64"))]
fn prefetch_line<T>(_: &T) {
    // No portable prefetch hint in std: elsewhere the pass meets its misses one by one.
}

/// The entries of a [`PrefixTable`], in no particular order.
pub struct Iter<'a, K, V> {
    slots: std::slice::Iter<'a, (K, V)>,
    default_entry: Option<&'a (K, V)>,
    /// Entries not yet given: an exact size, so that collecting them allocates once.
    left: usize,
}

impl<'a, K: Eq + Default, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        let vacant = K::default();
        let (k, v) = self
            .slots
            .find(|(k, _)| *k != vacant)
            .or_else(|| self.default_entry.take())?;
        self.left -= 1;
        Some((k, v))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<K: Eq + Default, V> ExactSizeIterator for Iter<'_, K, V> {}

impl<'a, K: Eq + Default, V> IntoIterator for &'a PrefixTable<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;

    fn into_iter(self) -> Iter<'a, K, V> {
        Iter {
            slots: self.slots.iter(),
            default_entry: self.default_entry.as_ref(),
            left: self.in_slots + usize::from(self.default_entry.is_some()),
        }
    }
}

/// How many entries, not what they are: a full table is a million of them.
impl<K, V> fmt::Debug for PrefixTable<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefixTable")
            .field(
                "entries",
                &(self.in_slots + usize::from(self.default_entry.is_some())),
            )
            .field("slots", &self.slots.len())
            .finish()
    }
}

#[cfg(test)]
mod tests;
