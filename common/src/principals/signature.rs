//! The signature an operation carries, as NATS headers: who signed (`Skein-Principal`, a public
//! user nkey), when (`Skein-Signed-At`, unix ms), a nonce (`Skein-Nonce`), for whom a delegate
//! acts (`Skein-On-Behalf-Of`, `Skein-On-Behalf-Roles`), and the ed25519 signature
//! (`Skein-Signature`, base64url) over [`signed_bytes`].

use async_nats::HeaderMap;
use base64::Engine;

use super::Role;

pub const HEADER_PRINCIPAL: &str = "Skein-Principal";
pub const HEADER_SIGNED_AT: &str = "Skein-Signed-At";
pub const HEADER_NONCE: &str = "Skein-Nonce";
pub const HEADER_ON_BEHALF_OF: &str = "Skein-On-Behalf-Of";
pub const HEADER_ON_BEHALF_ROLES: &str = "Skein-On-Behalf-Roles";
pub const HEADER_SIGNATURE: &str = "Skein-Signature";

const SIGNATURE_ENCODING: base64::engine::GeneralPurpose =
    base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The bytes a signature covers: a version line, the subject, the signed header values (time,
/// nonce, delegation; one per line) and the payload.
pub fn signed_bytes(subject: &str, header_part: &str, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(32 + subject.len() + header_part.len() + payload.len());
    bytes.extend_from_slice(b"skein-signed-v1\n");
    bytes.extend_from_slice(subject.as_bytes());
    bytes.push(b'\n');
    bytes.extend_from_slice(header_part.as_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

fn header_part(signed_at_ms: u64, nonce: &str, on_behalf: Option<(&str, &str)>) -> String {
    let (name, roles) = on_behalf.unwrap_or_default();
    format!("{signed_at_ms}\n{nonce}\n{name}\n{roles}\n")
}

fn roles_text(roles: &[Role]) -> String {
    roles
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// A principal's key pair, signing the operations this process publishes.
pub struct Signer {
    pair: nkeys::KeyPair,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("key", &self.pair.public_key())
            .finish()
    }
}

impl Signer {
    /// From a user nkey seed (`SU…`, as `skein keys new` or `nk -gen user` prints it).
    pub fn from_seed(seed: &str) -> Result<Self, String> {
        let pair = nkeys::KeyPair::from_seed(seed.trim()).map_err(|_| {
            "the principal key is not a user nkey seed (it starts with SU; `skein keys new` makes one)"
                .to_owned()
        })?;
        if pair.key_pair_type() != nkeys::KeyPairType::User {
            return Err("the principal key must be a user nkey seed (SU…)".into());
        }
        Ok(Self { pair })
    }

    /// A new random key pair.
    pub fn generate() -> Self {
        Self {
            pair: nkeys::KeyPair::new_user(),
        }
    }

    /// The public key the principals file lists.
    pub fn public_key(&self) -> String {
        self.pair.public_key()
    }

    /// The seed, for whoever holds this key.
    pub fn seed(&self) -> String {
        self.pair.seed().unwrap_or_default()
    }

    /// Adds the signature headers of a message to `headers`; with `on_behalf`, the caller a
    /// delegate acts for, and that caller's roles.
    pub fn sign(
        &self,
        headers: &mut HeaderMap,
        subject: &str,
        payload: &[u8],
        on_behalf: Option<(&str, &[Role])>,
    ) {
        let signed_at_ms = crate::protocol::now_ms();
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let on_behalf = on_behalf.map(|(name, roles)| (name.to_owned(), roles_text(roles)));
        let part = header_part(
            signed_at_ms,
            &nonce,
            on_behalf.as_ref().map(|(n, r)| (n.as_str(), r.as_str())),
        );
        // Signing with a seed-backed key does not fail.
        let signature = self
            .pair
            .sign(&signed_bytes(subject, &part, payload))
            .unwrap_or_default();
        headers.insert(HEADER_PRINCIPAL, self.pair.public_key().as_str());
        headers.insert(HEADER_SIGNED_AT, signed_at_ms.to_string().as_str());
        headers.insert(HEADER_NONCE, nonce.as_str());
        if let Some((name, roles)) = &on_behalf {
            headers.insert(HEADER_ON_BEHALF_OF, name.as_str());
            headers.insert(HEADER_ON_BEHALF_ROLES, roles.as_str());
        }
        headers.insert(
            HEADER_SIGNATURE,
            SIGNATURE_ENCODING.encode(signature).as_str(),
        );
    }
}

/// The signature headers of a received message, read.
pub(super) struct Fields {
    pub signed_at_ms: u64,
    pub nonce: String,
    pub on_behalf_of: Option<(String, Vec<Role>)>,
    on_behalf_raw: Option<(String, String)>,
    pub signature: Vec<u8>,
}

impl Fields {
    pub fn read(headers: Option<&HeaderMap>) -> Result<Self, String> {
        let header = |name: &str| headers.and_then(|h| h.get(name)).map(|v| v.as_str());
        let missing = |name: &str| format!("signed message without its {name} header");
        let signed_at_ms = header(HEADER_SIGNED_AT)
            .ok_or_else(|| missing(HEADER_SIGNED_AT))?
            .parse::<u64>()
            .map_err(|_| format!("{HEADER_SIGNED_AT} is not a time in unix milliseconds"))?;
        let nonce = header(HEADER_NONCE)
            .ok_or_else(|| missing(HEADER_NONCE))?
            .to_owned();
        if nonce.is_empty() || nonce.len() > 64 {
            return Err(format!("{HEADER_NONCE} must be 1 to 64 characters"));
        }
        let signature = SIGNATURE_ENCODING
            .decode(header(HEADER_SIGNATURE).ok_or_else(|| missing(HEADER_SIGNATURE))?)
            .map_err(|_| format!("{HEADER_SIGNATURE} is not base64url"))?;
        let on_behalf_raw = header(HEADER_ON_BEHALF_OF).map(|name| {
            (
                name.to_owned(),
                header(HEADER_ON_BEHALF_ROLES)
                    .unwrap_or_default()
                    .to_owned(),
            )
        });
        let on_behalf_of = match &on_behalf_raw {
            Some((name, roles)) => {
                crate::protocol::validate_token("principal name", name)
                    .map_err(|f| format!("{HEADER_ON_BEHALF_OF}: {}", f.message))?;
                let roles = roles
                    .split(',')
                    .filter(|r| !r.is_empty())
                    .map(|r| {
                        Role::parse(r).ok_or_else(|| format!("{HEADER_ON_BEHALF_ROLES}: {r:?}"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Some((name.clone(), roles))
            }
            None => None,
        };
        Ok(Self {
            signed_at_ms,
            nonce,
            on_behalf_of,
            on_behalf_raw,
            signature,
        })
    }

    /// The header values the signature covers, as [`signed_bytes`] takes them.
    pub fn header_part(&self) -> String {
        header_part(
            self.signed_at_ms,
            &self.nonce,
            self.on_behalf_raw
                .as_ref()
                .map(|(n, r)| (n.as_str(), r.as_str())),
        )
    }
}
