//! [`SmallMap`]: a map that is a vector of pairs while it holds a few
//! entries and a hash map beyond. For the tables every topic has and that
//! usually hold one entry (its log's cursors; in the broker its producers
//! and subscriptions): a hash map's first allocation holds three entries
//! and their control bytes (~150 bytes for a name and a pointer), a
//! vector's holds the one (~32). Issue 19's per-topic cost.
//!
//! Guarantees: what a `HashMap` gives for `get`, `insert`, `remove` and the
//! iterators (no order promised); a lookup compares at most `FEW_MAX` keys
//! before it is a hash lookup. An emptied map holds no allocation.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::collections::hash_map;
use std::hash::Hash;

/// Entries kept as a vector at most; the next one makes it a hash map.
const FEW_MAX: usize = 8;

/// A map of few entries (see the module doc).
#[derive(Debug, Clone)]
pub enum SmallMap<K, V> {
    /// At most `FEW_MAX` entries, with no spare room beyond what they
    /// needed.
    Few(Vec<(K, V)>),
    /// More entries than that.
    Many(HashMap<K, V>),
}

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> SmallMap<K, V> {
        SmallMap::Few(Vec::new())
    }
}

impl<K: Eq + Hash, V> SmallMap<K, V> {
    /// An empty map (no allocation).
    pub fn new() -> SmallMap<K, V> {
        SmallMap::default()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        match self {
            SmallMap::Few(few) => few.len(),
            SmallMap::Many(many) => many.len(),
        }
    }

    /// True when it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value of `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self {
            SmallMap::Few(few) => few.iter().find(|(k, _)| k.borrow() == key).map(|(_, v)| v),
            SmallMap::Many(many) => many.get(key),
        }
    }

    /// The value of `key`, to change.
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self {
            SmallMap::Few(few) => few
                .iter_mut()
                .find(|(k, _)| k.borrow() == key)
                .map(|(_, v)| v),
            SmallMap::Many(many) => many.get_mut(key),
        }
    }

    /// True when `key` has a value.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key).is_some()
    }

    /// Sets the value of `key`; returns the one it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self {
            SmallMap::Few(few) => {
                if let Some((_, old)) = few.iter_mut().find(|(k, _)| *k == key) {
                    return Some(std::mem::replace(old, value));
                }
                if few.len() < FEW_MAX {
                    // Exactly the room needed: most of these maps hold one
                    // entry for as long as they live.
                    few.reserve_exact(1);
                    few.push((key, value));
                } else {
                    let mut many: HashMap<K, V> = std::mem::take(few).into_iter().collect();
                    many.insert(key, value);
                    *self = SmallMap::Many(many);
                }
                None
            }
            SmallMap::Many(many) => many.insert(key, value),
        }
    }

    /// Removes `key`; returns its value.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let removed = match self {
            SmallMap::Few(few) => {
                let index = few.iter().position(|(k, _)| k.borrow() == key)?;
                Some(few.swap_remove(index).1)
            }
            SmallMap::Many(many) => many.remove(key),
        };
        if self.is_empty() {
            // An emptied map gives its allocation back.
            *self = SmallMap::default();
        }
        removed
    }

    /// Removes every entry (and gives the allocation back).
    pub fn clear(&mut self) {
        *self = SmallMap::default();
    }

    /// Keeps the entries `keep` says to keep.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        match self {
            SmallMap::Few(few) => few.retain_mut(|(k, v)| keep(k, v)),
            SmallMap::Many(many) => many.retain(|k, v| keep(k, v)),
        }
        if self.is_empty() {
            *self = SmallMap::default();
        }
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> Iter<'_, K, V> {
        match self {
            SmallMap::Few(few) => Iter::Few(few.iter()),
            SmallMap::Many(many) => Iter::Many(many.iter()),
        }
    }

    /// Every key.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.iter().map(|(k, _)| k)
    }

    /// Every value.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// Every value, to change.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        let (few, many) = match self {
            SmallMap::Few(few) => (Some(few.iter_mut().map(|(_, v)| v)), None),
            SmallMap::Many(many) => (None, Some(many.values_mut())),
        };
        few.into_iter().flatten().chain(many.into_iter().flatten())
    }

    /// Takes every entry out (the map is left empty, with no allocation).
    pub fn drain(&mut self) -> IntoIter<K, V> {
        std::mem::take(self).into_iter()
    }
}

impl<K, V> IntoIterator for SmallMap<K, V> {
    type Item = (K, V);
    type IntoIter = IntoIter<K, V>;

    fn into_iter(self) -> IntoIter<K, V> {
        match self {
            SmallMap::Few(few) => IntoIter::Few(few.into_iter()),
            SmallMap::Many(many) => IntoIter::Many(many.into_iter()),
        }
    }
}

/// The entries of a [`SmallMap`], borrowed.
#[derive(Debug)]
pub enum Iter<'a, K, V> {
    /// Of a vector.
    Few(std::slice::Iter<'a, (K, V)>),
    /// Of a hash map.
    Many(hash_map::Iter<'a, K, V>),
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<(&'a K, &'a V)> {
        match self {
            Iter::Few(few) => few.next().map(|(k, v)| (k, v)),
            Iter::Many(many) => many.next(),
        }
    }
}

/// The entries of a [`SmallMap`], taken.
#[derive(Debug)]
pub enum IntoIter<K, V> {
    /// Of a vector.
    Few(std::vec::IntoIter<(K, V)>),
    /// Of a hash map.
    Many(hash_map::IntoIter<K, V>),
}

impl<K, V> Iterator for IntoIter<K, V> {
    type Item = (K, V);

    fn next(&mut self) -> Option<(K, V)> {
        match self {
            IntoIter::Few(few) => few.next(),
            IntoIter::Many(many) => many.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_behaves_as_a_hash_map_across_its_two_forms() {
        let mut map = SmallMap::new();
        let mut model = HashMap::new();
        // Grows past FEW_MAX, then shrinks back, replacing as it goes.
        for round in 0..3u64 {
            for key in 0..(2 * FEW_MAX as u64) {
                assert_eq!(
                    map.insert(key.to_string(), key + round),
                    model.insert(key.to_string(), key + round)
                );
                assert_eq!(map.len(), model.len());
            }
            assert!(matches!(map, SmallMap::Many(_)));
            for key in (0..(2 * FEW_MAX as u64)).step_by(2) {
                assert_eq!(
                    map.remove(key.to_string().as_str()),
                    model.remove(&key.to_string())
                );
            }
            let mut entries: Vec<_> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
            let mut expected: Vec<_> = model.iter().map(|(k, v)| (k.clone(), *v)).collect();
            entries.sort();
            expected.sort();
            assert_eq!(entries, expected);
            for key in 0..(2 * FEW_MAX as u64) {
                assert_eq!(
                    map.get(key.to_string().as_str()),
                    model.get(&key.to_string())
                );
            }
            let drained: HashMap<_, _> = map.drain().collect();
            assert_eq!(drained, std::mem::take(&mut model));
            assert!(map.is_empty());
        }
    }

    #[test]
    fn one_entry_holds_exactly_its_room_and_an_emptied_map_none() {
        let mut map = SmallMap::new();
        map.insert("a".to_string(), 1u64);
        let SmallMap::Few(few) = &map else {
            panic!("one entry is a vector");
        };
        assert_eq!(few.capacity(), 1);
        *map.get_mut("a").unwrap_or(&mut 0) += 1;
        assert_eq!(map.values().copied().collect::<Vec<_>>(), vec![2]);
        map.retain(|_, v| *v > 5);
        let SmallMap::Few(few) = &map else {
            panic!("an emptied map is an empty vector");
        };
        assert_eq!(few.capacity(), 0);
    }
}
