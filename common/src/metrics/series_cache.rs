//! Series found by their label values as `&str`. A family finds a series by a whole label set,
//! which the caller builds of owned strings for every observation: on a turn's path, two dozen
//! allocations only to be hashed and dropped. [`SeriesCache`] keeps the handles a family gave
//! for a value (a handle shares the series' storage with the family) and finds them by the
//! value itself.
//!
//! Invariants:
//! - a value's handles come from its family, so the family's export sees every observation;
//! - at most [`MAX_CACHED_VALUES`] values per cache: past that, a value's handles are made
//!   again for each observation (as before the cache), so no value seen is ever left out.

use std::collections::HashMap;
use std::sync::RwLock;

/// The most values one cache keeps handles for.
pub(super) const MAX_CACHED_VALUES: usize = 128;

/// Handles of type `V` by label value.
pub(super) struct SeriesCache<V> {
    by_value: RwLock<HashMap<Box<str>, V>>,
}

impl<V> Default for SeriesCache<V> {
    fn default() -> Self {
        Self {
            by_value: RwLock::new(HashMap::new()),
        }
    }
}

impl<V> SeriesCache<SeriesCache<V>> {
    /// Runs `record` on the handles of the pair of values `first` and `second` (a cache by
    /// `first` of caches by `second`), made by `make` the first time the pair is seen.
    pub(super) fn with_pair<R>(
        &self,
        (first, second): (&str, &str),
        make: impl FnOnce() -> V,
        record: impl FnOnce(&V) -> R,
    ) -> R {
        self.with(first, SeriesCache::default, |by_second| {
            by_second.with(second, make, record)
        })
    }
}

impl<V> SeriesCache<V> {
    /// Runs `record` on the handles of `value`, made by `make` the first time it is seen.
    pub(super) fn with<R>(
        &self,
        value: &str,
        make: impl FnOnce() -> V,
        record: impl FnOnce(&V) -> R,
    ) -> R {
        if let Ok(cached) = self.by_value.read() {
            if let Some(handles) = cached.get(value) {
                return record(handles);
            }
        }
        let handles = make();
        match self.by_value.write() {
            Ok(mut cached) if cached.len() < MAX_CACHED_VALUES || cached.contains_key(value) => {
                record(cached.entry(value.into()).or_insert(handles))
            }
            _ => record(&handles),
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_value.read().map_or(0, |cached| cached.len())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn handles_are_made_once_per_value() {
        let cache = SeriesCache::default();
        let made = Cell::new(0);
        for value in ["a", "b", "a", "a", "b"] {
            let got = cache.with(
                value,
                || {
                    made.set(made.get() + 1);
                    value.to_uppercase()
                },
                Clone::clone,
            );
            assert_eq!(got, value.to_uppercase());
        }
        assert_eq!(made.get(), 2);
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn values_past_the_limit_are_recorded_without_being_kept() {
        let cache = SeriesCache::default();
        let recorded = Cell::new(0);
        for n in 0..MAX_CACHED_VALUES + 10 {
            let value = format!("v{n}");
            let got = cache.with(
                &value,
                || n,
                |handle| {
                    recorded.set(recorded.get() + 1);
                    *handle
                },
            );
            assert_eq!(got, n);
        }
        assert_eq!(recorded.get(), MAX_CACHED_VALUES + 10);
        assert_eq!(cache.len(), MAX_CACHED_VALUES);
        // A kept value is still found.
        assert_eq!(cache.with("v0", || usize::MAX, |handle| *handle), 0);
    }
}
