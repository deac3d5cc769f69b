//! The tool specs a model request offers ([`ToolList`]): shared by every turn that offers the
//! same, with the bytes they add to a prompt measured once. A schema is measured by serializing
//! it, so a catalog of large schemas measured on every model call (budgets and request sizing
//! both ask) would cost its whole size in JSON each time.

use std::ops::Deref;
use std::sync::Arc;

use crate::protocol::ToolSpec;

/// Tool specs, shared, with their byte bound ([`crate::agent::tokens::tools_upper_bound`]) taken
/// when the list is made. Reads as a slice of specs.
#[derive(Debug, Clone, Default)]
pub struct ToolList {
    specs: Arc<[ToolSpec]>,
    bytes: u64,
}

impl ToolList {
    /// Measures `specs` once.
    pub fn new(specs: Arc<[ToolSpec]>) -> Self {
        let bytes = crate::agent::tokens::tools_upper_bound(&specs);
        Self { specs, bytes }
    }

    /// The bytes the specs add to a request: their names', descriptions' and schemas' (see
    /// [`crate::agent::tokens::tools_upper_bound`]).
    pub fn upper_bound(&self) -> u64 {
        self.bytes
    }

    /// Whether `other` is this very list (a clone of it), not only equal specs.
    pub fn shares_specs_with(&self, other: &ToolList) -> bool {
        Arc::ptr_eq(&self.specs, &other.specs)
    }
}

impl Deref for ToolList {
    type Target = [ToolSpec];

    fn deref(&self) -> &[ToolSpec] {
        &self.specs
    }
}

impl From<Arc<[ToolSpec]>> for ToolList {
    fn from(specs: Arc<[ToolSpec]>) -> Self {
        Self::new(specs)
    }
}

impl From<Vec<ToolSpec>> for ToolList {
    fn from(specs: Vec<ToolSpec>) -> Self {
        Self::new(specs.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, parameters: serde_json::Value) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: format!("{name} things"),
            parameters,
            concurrency_safe: true,
            effects: Default::default(),
        }
    }

    #[test]
    fn a_list_keeps_the_bound_its_specs_were_measured_at() {
        let parameters = serde_json::json!({
            "type": "object",
            "properties": {"path": {"type": "string", "description": "a \"quoted\" path"}},
        });
        let specs = vec![
            spec("read_file", parameters.clone()),
            spec("ls", parameters),
        ];
        let measured = crate::agent::tokens::tools_upper_bound(&specs);
        let list = ToolList::from(specs);
        assert_eq!(list.upper_bound(), measured);
        let schema = serde_json::to_string(&list[0].parameters).expect("a schema serializes");
        assert!(measured > 2 * schema.len() as u64);
        assert_eq!(list.len(), 2);
        // Shared, not copied: a clone reads the same specs.
        let shared = list.clone();
        assert!(shared.shares_specs_with(&list));
        assert!(!ToolList::from(list.to_vec()).shares_specs_with(&list));
        assert_eq!(ToolList::default().upper_bound(), 0);
        assert!(ToolList::default().is_empty());
    }
}
