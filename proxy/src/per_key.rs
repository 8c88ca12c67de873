//! Counts held per key, each released when its holder is dropped: the proxy's
//! caps per source and per party (`listener`) and its one upload per owner
//! (`service`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Counts held per key (a source, a party, an owner).
pub struct PerKey<K>(Arc<Mutex<HashMap<K, usize>>>);

impl<K> Clone for PerKey<K> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<K> Default for PerKey<K> {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(HashMap::new())))
    }
}

/// One count held in a [`PerKey`] table, released on drop.
pub struct Held<K: std::hash::Hash + Eq> {
    table: Arc<Mutex<HashMap<K, usize>>>,
    key: K,
}

impl<K: std::hash::Hash + Eq> Drop for Held<K> {
    fn drop(&mut self) {
        if let Ok(mut map) = self.table.lock() {
            if let Some(n) = map.get_mut(&self.key) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&self.key);
                }
            }
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone> PerKey<K> {
    /// Holds one count of `key`, unless it already holds `max`.
    pub fn take(&self, key: K, max: usize) -> Option<Held<K>> {
        // No entry for a key that may hold none: it would never be removed.
        if max == 0 {
            return None;
        }
        let mut map = self.0.lock().ok()?;
        let n = map.entry(key.clone()).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Held {
            table: Arc::clone(&self.0),
            key,
        })
    }

    /// How many counts of `key` are held (for tests that wait for a holder).
    #[cfg(test)]
    pub fn held(&self, key: &K) -> usize {
        self.0
            .lock()
            .map(|map| map.get(key).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_holds_at_most_its_cap_and_a_drop_gives_one_back() {
        let table = PerKey::<&str>::default();
        let first = table.take("a", 2).expect("first");
        let second = table.take("a", 2).expect("second");
        assert!(table.take("a", 2).is_none(), "a third past the cap");
        assert!(
            table.take("b", 2).is_some(),
            "another key has its own count"
        );
        drop(first);
        let third = table.take("a", 2).expect("freed by the drop");
        drop((second, third));
        assert!(
            table.0.lock().expect("lock").is_empty(),
            "nothing left held"
        );
    }
}
