//! `ByTask`: what this lead holds for each task it is working on (the signal that wakes a parked
//! turn, the flag that tells a running one to read its controls), by tenant and task id.
//!
//! Invariant: an entry lives exactly as long as the guard its registration returned, so the map
//! only holds tasks this lead is working on now.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type Key = (String, String);

/// Values by (tenant, task id), each removed when its guard drops.
pub struct ByTask<V> {
    map: Arc<Mutex<HashMap<Key, V>>>,
}

impl<V> Clone for ByTask<V> {
    fn clone(&self) -> Self {
        Self {
            map: self.map.clone(),
        }
    }
}

impl<V> Default for ByTask<V> {
    fn default() -> Self {
        Self {
            map: Arc::default(),
        }
    }
}

/// Removes its task's entry when dropped.
pub struct Registered<V> {
    map: Arc<Mutex<HashMap<Key, V>>>,
    key: Key,
}

impl<V> Drop for Registered<V> {
    fn drop(&mut self) {
        if let Ok(mut map) = self.map.lock() {
            map.remove(&self.key);
        }
    }
}

impl<V: Clone> ByTask<V> {
    /// Holds `value` for the task until the returned guard drops.
    pub fn register(&self, tenant: &str, task_id: &str, value: V) -> Registered<V> {
        let key = (tenant.to_owned(), task_id.to_owned());
        if let Ok(mut map) = self.map.lock() {
            map.insert(key.clone(), value);
        }
        Registered {
            map: self.map.clone(),
            key,
        }
    }

    /// The value held for the task, if this lead works on it.
    pub fn get(&self, tenant: &str, task_id: &str) -> Option<V> {
        let key = (tenant.to_owned(), task_id.to_owned());
        self.map.lock().ok().and_then(|map| map.get(&key).cloned())
    }

    pub fn len(&self) -> usize {
        self.map.lock().map(|map| map.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lives_as_long_as_its_guard() {
        let held = ByTask::default();
        let guard = held.register("acme", "t1", 7);
        assert_eq!(held.get("acme", "t1"), Some(7));
        assert_eq!(held.get("acme", "t2"), None);
        assert_eq!(held.len(), 1);
        drop(guard);
        assert_eq!(held.get("acme", "t1"), None);
        assert!(held.is_empty());
    }
}
