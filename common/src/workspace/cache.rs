//! `ContentCache`: file contents a process has already read or written, by object, so reading a
//! file again (a long file read page by page, a grep over the session) does not fetch its chunks
//! again.
//!
//! Invariants:
//! - an entry is used only for the exact version it was stored with: the caller passes the
//!   object's current identity (its `nuid` and digest, read from the object's metadata just
//!   before), and a different identity is a miss that also drops the stale entry;
//! - memory is bounded: the sum of cached contents never exceeds the capacity; the least recently
//!   used entries are evicted first, and a content larger than a quarter of the capacity is not
//!   cached at all (it would evict everything else);
//! - the lock is never held across an `.await` (every method is synchronous).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use bytes::Bytes;

/// Which version of an object a content is: the object store's `nuid` (new for every write)
/// and the content's digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentId {
    pub nuid: String,
    pub digest: String,
}

struct Entry {
    id: ContentId,
    content: Bytes,
    /// Position in the recency order.
    tick: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Recency order: tick -> key; the smallest tick is the least recently used.
    order: BTreeMap<u64, String>,
    bytes: usize,
    next_tick: u64,
}

impl Inner {
    fn touch(&mut self, key: &str) {
        let tick = self.next_tick;
        self.next_tick += 1;
        if let Some(entry) = self.entries.get_mut(key) {
            self.order.remove(&entry.tick);
            entry.tick = tick;
            self.order.insert(tick, key.to_owned());
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some(entry) = self.entries.remove(key) {
            self.order.remove(&entry.tick);
            self.bytes -= entry.content.len();
        }
    }
}

/// Contents by object key, bounded in bytes. See the module invariants.
pub struct ContentCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for ContentCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (entries, bytes) = self.usage();
        f.debug_struct("ContentCache")
            .field("capacity", &self.capacity)
            .field("entries", &entries)
            .field("bytes", &bytes)
            .finish()
    }
}

impl ContentCache {
    /// A cache holding at most `capacity` bytes of contents (0 turns caching off).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The content stored for `key`, if it is the version `current` names.
    pub fn get(&self, key: &str, current: &ContentId) -> Option<Bytes> {
        let mut inner = self.lock();
        match inner.entries.get(key) {
            Some(entry) if entry.id == *current => {
                let content = entry.content.clone();
                inner.touch(key);
                Some(content)
            }
            Some(_) => {
                inner.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remembers `content` as version `id` of `key`, evicting the least recently used entries
    /// as needed.
    pub fn put(&self, key: &str, id: ContentId, content: Bytes) {
        let mut inner = self.lock();
        inner.remove(key);
        if content.len() > self.capacity / 4 {
            return;
        }
        while inner.bytes + content.len() > self.capacity {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            if let Some(entry) = inner.entries.remove(&oldest) {
                inner.bytes -= entry.content.len();
            }
        }
        let tick = inner.next_tick;
        inner.next_tick += 1;
        inner.bytes += content.len();
        inner.order.insert(tick, key.to_owned());
        inner
            .entries
            .insert(key.to_owned(), Entry { id, content, tick });
    }

    /// Forgets `key` (the object was deleted or its write failed half-way).
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Entries and bytes held now.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.entries.len(), inner.bytes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the maps consistent (every update is done
        // before anything that could panic), so a poisoned lock is still usable.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(nuid: &str, digest: &str) -> ContentId {
        ContentId {
            nuid: nuid.into(),
            digest: digest.into(),
        }
    }

    #[test]
    fn an_entry_serves_only_the_version_it_was_stored_with() {
        let cache = ContentCache::new(1024);
        cache.put("s/a", id("n1", "d1"), Bytes::from_static(b"old"));
        assert_eq!(
            cache.get("s/a", &id("n1", "d1")),
            Some(Bytes::from_static(b"old"))
        );
        // Rewritten elsewhere: a new nuid, or the same nuid with another digest, is a miss...
        assert_eq!(cache.get("s/a", &id("n2", "d1")), None);
        // ...and the stale entry is gone, even for the version it held.
        assert_eq!(cache.get("s/a", &id("n1", "d1")), None);
        cache.put("s/a", id("n3", "d3"), Bytes::from_static(b"new"));
        assert_eq!(cache.get("s/a", &id("n3", "other")), None);
        assert_eq!(cache.usage(), (0, 0));
        assert_eq!(cache.get("s/b", &id("n3", "d3")), None);
    }

    #[test]
    fn memory_stays_under_the_capacity_evicting_the_least_recently_used() {
        let cache = ContentCache::new(100);
        for key in ["a", "b", "c", "d"] {
            cache.put(key, id(key, key), Bytes::from(vec![0u8; 25]));
        }
        assert_eq!(cache.usage(), (4, 100));
        // "a" is used, so "b" is now the oldest.
        assert!(cache.get("a", &id("a", "a")).is_some());
        cache.put("e", id("e", "e"), Bytes::from(vec![0u8; 20]));
        assert_eq!(cache.usage(), (4, 95));
        assert!(cache.get("b", &id("b", "b")).is_none());
        assert!(cache.get("a", &id("a", "a")).is_some());
        // Over a quarter of the capacity: not cached, nothing evicted.
        cache.put("big", id("big", "big"), Bytes::from(vec![0u8; 26]));
        assert!(cache.get("big", &id("big", "big")).is_none());
        assert_eq!(cache.usage(), (4, 95));
        // Replacing an entry counts its new size only.
        cache.put("a", id("a2", "a2"), Bytes::from(vec![0u8; 5]));
        assert_eq!(cache.usage(), (4, 75));
        cache.forget("a");
        assert_eq!(cache.usage(), (3, 70));
    }

    #[test]
    fn a_zero_capacity_caches_nothing() {
        let cache = ContentCache::new(0);
        cache.put("a", id("a", "a"), Bytes::from_static(b"x"));
        assert_eq!(cache.get("a", &id("a", "a")), None);
        // Empty contents cost nothing and may be kept.
        cache.put("e", id("e", "e"), Bytes::new());
        assert_eq!(cache.usage().1, 0);
    }
}
