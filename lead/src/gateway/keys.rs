//! Who is calling the gateway: API keys, each bound to one tenant, a principal and roles, read
//! from a TOML file (`SKEIN_GATEWAY_KEYS`, usually mounted from a Secret). The file holds only
//! the SHA-256 of each key (hex), never the key itself; a request presents the key as
//! `Authorization: Bearer <key>`. The tenant of every request comes from its key, never from its
//! body.
//!
//! ```toml
//! [[keys]]
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! tenant = "acme"
//! principal = "alice"
//! roles = ["submit"]
//! requests_per_minute = 120   # optional: this key's own limit (else the gateway's)
//! ```

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// What a key may do (a gateway key never has `delegate`: that is the gateway's own role).
pub use skein_common::principals::Role;

/// The caller a key proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub tenant: String,
    pub name: String,
    pub roles: Vec<Role>,
    /// Names the key in counters (the head of its hash), never the key itself.
    pub key_id: String,
    /// This key's own request limit, when the file sets one.
    pub requests_per_minute: Option<u32>,
}

impl Principal {
    pub fn may(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default)]
    keys: Vec<KeyEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    sha256: String,
    tenant: String,
    principal: String,
    #[serde(default)]
    roles: Vec<Role>,
    #[serde(default)]
    requests_per_minute: Option<u32>,
}

/// The gateway's keys, by the SHA-256 of each.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    by_hash: HashMap<[u8; 32], Principal>,
}

impl Keys {
    /// Reads a keys file; every mistake in it is an error naming the entry.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the gateway keys {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("gateway keys {}: {e}", path.display()))
    }

    /// Parses the TOML text of a keys file.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: KeysFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut by_hash = HashMap::new();
        for (i, entry) in file.keys.into_iter().enumerate() {
            let which = format!("key {} ({})", i + 1, entry.principal);
            let hash = parse_hash(&entry.sha256).ok_or_else(|| {
                format!("{which}: sha256 must be 64 hex digits (the SHA-256 of the key)")
            })?;
            skein_common::protocol::validate_token("tenant", &entry.tenant)
                .map_err(|f| format!("{which}: {}", f.message))?;
            if entry.principal.trim().is_empty() {
                return Err(format!("{which}: principal is empty"));
            }
            if entry.roles.contains(&Role::Delegate) {
                return Err(format!(
                    "{which}: delegate is the gateway's own role (in the principals file), not a key's"
                ));
            }
            let principal = Principal {
                tenant: entry.tenant,
                name: entry.principal,
                roles: entry.roles,
                key_id: entry.sha256.trim()[..16].to_ascii_lowercase(),
                requests_per_minute: entry.requests_per_minute,
            };
            if by_hash.insert(hash, principal).is_some() {
                return Err(format!("{which}: the same key is listed twice"));
            }
        }
        Ok(Self { by_hash })
    }

    /// The principal a presented key proves, if any.
    pub fn verify(&self, key: &str) -> Option<&Principal> {
        let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.by_hash.get(&hash)
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

/// The SHA-256 of a key as the keys file writes it (hex).
pub fn key_hash(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_proves_the_principal_its_hash_is_listed_with() {
        let text = format!(
            "[[keys]]\nsha256 = \"{}\"\ntenant = \"acme\"\nprincipal = \"alice\"\nroles = [\"submit\"]\n",
            key_hash("sk-alice")
        );
        let keys = Keys::parse(&text).expect("valid");
        let alice = keys.verify("sk-alice").expect("known key");
        assert_eq!(
            (alice.tenant.as_str(), alice.name.as_str()),
            ("acme", "alice")
        );
        assert!(alice.may(Role::Submit) && !alice.may(Role::Approve));
        assert!(keys.verify("sk-alice ").is_none());
        assert!(keys.verify("").is_none());
    }

    #[test]
    fn mistakes_in_the_keys_file_name_the_entry() {
        let bad_hash = "[[keys]]\nsha256 = \"abc\"\ntenant = \"acme\"\nprincipal = \"bob\"\n";
        assert!(Keys::parse(bad_hash)
            .expect_err("refused")
            .contains("key 1 (bob)"));
        let bad_tenant = format!(
            "[[keys]]\nsha256 = \"{}\"\ntenant = \"a.b\"\nprincipal = \"bob\"\n",
            key_hash("k")
        );
        assert!(Keys::parse(&bad_tenant)
            .expect_err("refused")
            .contains("tenant"));
        let twice = format!(
            "[[keys]]\nsha256 = \"{h}\"\ntenant = \"a\"\nprincipal = \"x\"\n[[keys]]\nsha256 = \"{h}\"\ntenant = \"b\"\nprincipal = \"y\"\n",
            h = key_hash("k")
        );
        assert!(Keys::parse(&twice).expect_err("refused").contains("twice"));
        let unknown_role = format!(
            "[[keys]]\nsha256 = \"{}\"\ntenant = \"a\"\nprincipal = \"x\"\nroles = [\"root\"]\n",
            key_hash("k")
        );
        assert!(Keys::parse(&unknown_role).is_err());
    }
}
