//! Values by reference: a value too large for one broker message (a tool call's arguments, a
//! subagent's input, the arguments an event shows, a final answer) is stored whole in the NATS
//! object store, and a [`PayloadRef`] travels in its place, beside a preview where the message
//! has room for one. `crate::payloads` stores and reads them.
//!
//! Invariants:
//! - a reference names one object of its tenant's bucket (`skein-payloads-<tenant>`), whose
//!   name starts with the session it belongs to (`<session>/…`), and the exact bytes stored there:
//!   a reader checks the bucket, the size and the digest before it trusts what it read;
//! - what the bytes are follows from the field that carries the reference: JSON for arguments,
//!   UTF-8 text for an input or an answer.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What every payload bucket's name starts with; the tenant follows.
pub const PAYLOAD_BUCKET_PREFIX: &str = "skein-payloads-";

/// Where a value that did not travel inline is stored whole. Any NATS client reads it from the
/// object store (`nats object get <bucket> <name>`); `SkeinClient::fetch_payload` does it in Rust.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PayloadRef {
    /// The object-store bucket: `skein-payloads-<tenant>`.
    pub bucket: String,
    /// The object's name in it: `<session>/<task_id>/<SHA-256 of the value, in hex>`.
    pub name: String,
    /// Size of the value, in bytes.
    pub size: u64,
    /// `SHA-256=` and the URL-safe base64 of the value's SHA-256, as the object store records it.
    pub digest: String,
}
