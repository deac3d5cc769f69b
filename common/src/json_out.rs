//! Values written as JSON at their exact length, for everything a turn or a call sends or stores:
//! each value is written into a buffer the thread keeps and copied out once, in one allocation
//! of its size. (`serde_json::to_vec` starts at 128 bytes and doubles: three or four allocations
//! for a 500-byte task, and a vector with room to spare costs `Bytes::from` one more.) The size of
//! a value's JSON is measured without writing it anywhere. Long texts written often (a
//! checkpoint's messages) go through [`push_str`], which escapes a string eight bytes at a time.
//!
//! Invariants:
//! - the output is byte for byte what `serde_json::to_vec` and `to_string` give;
//! - a thread keeps at most [`KEPT_CAPACITY`] bytes of buffer between values (a larger one, grown
//!   by a large value, is dropped after it);
//! - a value written while the thread's buffer is in use (a `Serialize` impl that writes JSON of
//!   its own) gets a buffer of its own: nothing panics, nothing is mixed.

use std::cell::RefCell;

mod strings;

pub use strings::push_str;

use bytes::Bytes;
use serde::Serialize;

/// The most buffer a thread keeps between values.
pub const KEPT_CAPACITY: usize = 64 * 1024;

/// A thread's buffer starts at this size: room for a call, an event or a result.
const FIRST_CAPACITY: usize = 4096;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Writes `value` into the thread's buffer and hands the written bytes to `take`.
fn written<T, R>(value: &T, take: impl FnOnce(&[u8]) -> R) -> serde_json::Result<R>
where
    T: Serialize + ?Sized,
{
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buffer) => {
            if buffer.capacity() == 0 {
                buffer.reserve(FIRST_CAPACITY);
            }
            buffer.clear();
            let result = serde_json::to_writer(&mut *buffer, value).map(|()| take(&buffer));
            if buffer.capacity() > KEPT_CAPACITY {
                *buffer = Vec::new();
            }
            result
        }
        // In use further up this thread's stack: a buffer of its own.
        Err(_) => serde_json::to_vec(value).map(|bytes| take(&bytes)),
    })
}

/// `value` as JSON, in a vector of exactly its length.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Vec<u8>> {
    written(value, <[u8]>::to_vec)
}

/// `value` as JSON, in bytes of exactly its length (no allocation beside the bytes').
pub fn to_bytes<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Bytes> {
    to_vec(value).map(Bytes::from)
}

/// Why a value was not encoded within its limit.
#[derive(Debug)]
pub enum NotWithin {
    /// Its JSON is `size` bytes, over the limit (the bytes are not copied out).
    TooLarge { size: usize },
    /// It cannot be written as JSON.
    Json(serde_json::Error),
}

/// `value` as JSON, unless it is longer than `limit` bytes.
pub fn to_bytes_within<T: Serialize + ?Sized>(value: &T, limit: usize) -> Result<Bytes, NotWithin> {
    written(value, |json| {
        if json.len() > limit {
            Err(NotWithin::TooLarge { size: json.len() })
        } else {
            Ok(Bytes::copy_from_slice(json))
        }
    })
    .map_err(NotWithin::Json)?
}

/// Appends `,"name":` and `value`'s JSON to `out`: a member, after the first, of an object
/// written by hand.
pub fn push_member<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    name: &str,
    value: &T,
) -> serde_json::Result<()> {
    out.push(b',');
    push_str(out, name);
    out.push(b':');
    serde_json::to_writer(out, value)
}

/// `value` as a JSON string of exactly its length.
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<String> {
    written(value, |json| String::from_utf8_lossy(json).into_owned())
}

/// The length in bytes of `value`'s JSON, written nowhere.
pub fn encoded_len<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<usize> {
    let mut counter = Counter(0);
    serde_json::to_writer(&mut counter, value)?;
    Ok(counter.0)
}

/// Counts what is written to it.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde::ser::{Serialize, Serializer};
    use serde_json::json;

    use super::*;

    fn values() -> Vec<serde_json::Value> {
        vec![
            json!(null),
            json!("quotes \" and \\ and \n and ünïcödé and \u{1}"),
            json!({"task_id": "t-1", "arguments": {"path": "a/b", "n": [1, 2.5, -3]}, "ok": true}),
            json!("x".repeat(3 * KEPT_CAPACITY)),
        ]
    }

    #[test]
    fn output_is_what_serde_json_writes() {
        for value in values() {
            let expected = serde_json::to_vec(&value).expect("encodes");
            assert_eq!(to_vec(&value).expect("encodes"), expected);
            assert_eq!(to_bytes(&value).expect("encodes"), expected);
            assert_eq!(
                to_string(&value).expect("encodes"),
                serde_json::to_string(&value).expect("encodes")
            );
            assert_eq!(encoded_len(&value).expect("encodes"), expected.len());
        }
    }

    #[test]
    fn copies_are_exactly_their_length() {
        let value = json!({"text": "y".repeat(700)});
        let vec = to_vec(&value).expect("encodes");
        assert_eq!(vec.capacity(), vec.len());
        assert_eq!(to_string(&value).expect("encodes").capacity(), vec.len());
    }

    #[test]
    fn a_value_over_the_limit_reads_its_size() {
        let value = json!({"text": "z".repeat(100)});
        let size = serde_json::to_vec(&value).expect("encodes").len();
        assert_eq!(to_bytes_within(&value, size).expect("fits").len(), size);
        match to_bytes_within(&value, size - 1) {
            Err(NotWithin::TooLarge { size: measured }) => assert_eq!(measured, size),
            other => panic!("expected the size, got {other:?}"),
        }
    }

    #[test]
    fn a_large_value_does_not_stay_in_the_threads_buffer() {
        to_vec(&"w".repeat(4 * KEPT_CAPACITY)).expect("encodes");
        let kept = SCRATCH.with(|scratch| scratch.borrow().capacity());
        assert!(kept <= KEPT_CAPACITY, "kept {kept} bytes");
        to_vec(&"small").expect("encodes");
        let kept = SCRATCH.with(|scratch| scratch.borrow().capacity());
        assert!(kept > 0 && kept <= KEPT_CAPACITY, "kept {kept} bytes");
    }

    /// A value whose serialization writes JSON of its own, as a nested string.
    struct Nested(serde_json::Value);

    impl Serialize for Nested {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let inner = to_string(&self.0).map_err(serde::ser::Error::custom)?;
            serializer.serialize_str(&inner)
        }
    }

    #[test]
    fn a_value_written_inside_another_gets_a_buffer_of_its_own() {
        let inner = json!({"a": [1, 2, 3]});
        let nested = Nested(inner.clone());
        let expected = serde_json::to_string(&serde_json::to_string(&inner).expect("encodes"))
            .expect("encodes");
        assert_eq!(to_string(&nested).expect("encodes"), expected);
        assert_eq!(
            to_string(&vec![Nested(inner.clone()), Nested(inner)])
                .expect("encodes")
                .len(),
            2 * expected.len() + 3
        );
    }

    #[test]
    fn an_error_leaves_the_buffer_usable() {
        let mut map = std::collections::BTreeMap::new();
        map.insert(vec![1u8], 1);
        assert!(to_vec(&map).is_err());
        assert_eq!(to_vec(&json!([1])).expect("encodes"), b"[1]");
    }
}
