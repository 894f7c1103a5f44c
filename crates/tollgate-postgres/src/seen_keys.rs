//! The keys these stores have seen with a row. A claim of a key seen here reads first: it is most
//! likely a replay, answered by one read and no write. A claim of any other key goes straight to
//! the claim function, which answers a key that has a row with nothing, and the read follows, so a
//! first call costs one statement, not two (H-30). Either order gives the same outcome, so the set
//! only decides which statement goes first: a key it lost (evicted, seen by another instance, or a
//! hash collision) costs one statement more, never a wrong answer.

use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::Mutex;
use tollgate_core::ids::{OperationKey, Scope};

/// Keys remembered per generation; two generations are kept, so between
/// `SEEN_KEYS_PER_GENERATION` and twice as many of the latest keys are remembered (16 bytes
/// each, plus the set's overhead: a few MiB at most).
pub(crate) const SEEN_KEYS_PER_GENERATION: usize = 65_536;

/// A bounded set of `(scope, operation key)` digests, in two generations: when the current one
/// is full it becomes the previous one, and the previous one is dropped.
#[derive(Debug)]
pub(crate) struct SeenKeys {
    hasher: RandomState,
    generations: Mutex<Generations>,
    capacity: usize,
}

#[derive(Debug, Default)]
struct Generations {
    current: HashSet<u64>,
    previous: HashSet<u64>,
}

impl SeenKeys {
    /// An empty set of at most `capacity` keys per generation (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            hasher: RandomState::new(),
            generations: Mutex::new(Generations::default()),
            capacity: capacity.max(1),
        }
    }

    fn digest(&self, scope: &Scope, key: &OperationKey) -> u64 {
        self.hasher.hash_one((scope.as_str(), key.as_str()))
    }

    /// Whether `(scope, key)` was seen with a row (a poisoned lock answers no: the claim then
    /// goes first, which is correct either way).
    pub(crate) fn contains(&self, scope: &Scope, key: &OperationKey) -> bool {
        let digest = self.digest(scope, key);
        self.generations
            .lock()
            .map(|g| g.current.contains(&digest) || g.previous.contains(&digest))
            .unwrap_or(false)
    }

    /// Remembers that `(scope, key)` has a row.
    pub(crate) fn insert(&self, scope: &Scope, key: &OperationKey) {
        let digest = self.digest(scope, key);
        if let Ok(mut g) = self.generations.lock() {
            if g.current.len() >= self.capacity {
                let full = std::mem::take(&mut g.current);
                g.previous = full;
            }
            g.current.insert(digest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> OperationKey {
        OperationKey::parse(s).unwrap()
    }

    #[test]
    fn h_30_keys_are_remembered_per_scope_for_two_generations() {
        let scope = Scope::parse("a").unwrap();
        let other = Scope::parse("b").unwrap();
        let seen = SeenKeys::new(2);
        seen.insert(&scope, &key("k1"));
        assert!(seen.contains(&scope, &key("k1")));
        assert!(!seen.contains(&other, &key("k1")), "keys are per scope");
        assert!(!seen.contains(&scope, &key("k2")));
        seen.insert(&scope, &key("k2"));
        // The third key starts a generation: the first two are still remembered.
        seen.insert(&scope, &key("k3"));
        assert!(seen.contains(&scope, &key("k1")) && seen.contains(&scope, &key("k2")));
        seen.insert(&scope, &key("k4"));
        // The fifth starts another: the first generation is gone.
        seen.insert(&scope, &key("k5"));
        assert!(!seen.contains(&scope, &key("k1")) && !seen.contains(&scope, &key("k2")));
        assert!(seen.contains(&scope, &key("k3")) && seen.contains(&scope, &key("k5")));
    }
}
