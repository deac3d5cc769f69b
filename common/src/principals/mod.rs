//! Principals: who acts on a task, proven. Every operation that changes a task — submit, cancel,
//! pause, resume, steer, approve or deny — may carry an ed25519 signature (a NATS nkey) by a
//! principal listed with its tenant and roles in a principals file (`SKEIN_PRINCIPALS`, usually
//! mounted from a Secret):
//!
//! ```toml
//! [[principals]]
//! name = "alice"
//! tenant = "acme"            # "*": every tenant (an operator)
//! roles = ["submit", "approve"]
//! key = "UC…"                # the public user nkey (`skein keys new` makes a pair)
//! ```
//!
//! [`Gate::check`] turns a message into the principal that acts ([`Acting`]) or a [`Refusal`]
//! that says why: unsigned (when `SKEIN_REQUIRE_SIGNED` is on), unknown key, a signature that does
//! not verify (forged or altered), signed too long before the broker stored it (expired, or
//! replayed later), another tenant's task, or a role that may not do this. Replays inside the
//! window are caught by the caller, which remembers each signature's nonce (`store::nonces`):
//! the gate is pure.
//!
//! A principal with the `delegate` role (the gateway) acts for the callers it proved itself: it
//! names them and their roles in signed headers, and they are who acts.
//!
//! Invariants: a signature covers the subject (so the tenant and task), the time, the nonce, the
//! delegation headers and the payload: none of them can be changed or moved to another task
//! without the key; the recorded principal of a signed operation is always the verified one,
//! never the name the message claims.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use async_nats::HeaderMap;
use serde::{Deserialize, Serialize};

mod signature;

pub use signature::{
    signed_bytes, Signer, HEADER_NONCE, HEADER_ON_BEHALF_OF, HEADER_ON_BEHALF_ROLES,
    HEADER_PRINCIPAL, HEADER_SIGNATURE, HEADER_SIGNED_AT,
};

/// How far a signature's time may lie from when the broker stored its message, by default.
pub const DEFAULT_SIGNATURE_WINDOW: Duration = Duration::from_secs(300);

/// The tenant of a principal that acts in every tenant (an operator).
pub const EVERY_TENANT: &str = "*";

/// What a principal may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Start runs, read them, cancel and steer them.
    Submit,
    /// Answer calls that wait for a person.
    Approve,
    /// Operate: cancel, pause and resume, dead letters, sessions and workspaces.
    Operate,
    /// Act for callers it proved itself (the gateway), naming them in signed headers.
    Delegate,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Submit => "submit",
            Role::Approve => "approve",
            Role::Operate => "operate",
            Role::Delegate => "delegate",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "submit" => Some(Role::Submit),
            "approve" => Some(Role::Approve),
            "operate" => Some(Role::Operate),
            "delegate" => Some(Role::Delegate),
            _ => None,
        }
    }
}

/// An operation on a task, as far as who may do it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Submit,
    Cancel,
    Approve,
    Pause,
    Resume,
    Steer,
    /// Dead letters, sessions and workspace files.
    Operate,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Submit => "submit",
            Operation::Cancel => "cancel",
            Operation::Approve => "approve",
            Operation::Pause => "pause",
            Operation::Resume => "resume",
            Operation::Steer => "steer",
            Operation::Operate => "operate",
        }
    }

    /// The roles of which any one allows it.
    pub fn allowed_roles(self) -> &'static [Role] {
        match self {
            Operation::Submit => &[Role::Submit],
            Operation::Cancel | Operation::Steer => &[Role::Submit, Role::Operate],
            Operation::Approve => &[Role::Approve],
            Operation::Pause | Operation::Resume | Operation::Operate => &[Role::Operate],
        }
    }
}

/// A principal as the principals file lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    /// Its tenant, or [`EVERY_TENANT`].
    pub tenant: String,
    pub roles: Vec<Role>,
}

impl Principal {
    pub fn may(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }

    /// Whether it acts in `tenant`.
    pub fn covers(&self, tenant: &str) -> bool {
        self.tenant == EVERY_TENANT || self.tenant == tenant
    }
}

/// How the acting principal is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proof {
    /// Its own signature, checked against its listed key.
    Signed,
    /// The signature of a delegate (named) that proved the caller itself.
    Delegated { by: String },
    /// Nothing: the message is unsigned and signatures are not required, so the name is the
    /// message's own claim.
    Claimed,
}

/// Who performs an operation, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acting {
    pub principal: Principal,
    pub proof: Proof,
    /// The signature's nonce and signing key, for the caller's replay check (signed only).
    pub nonce: Option<(String, String)>,
}

impl Acting {
    /// An unsigned message's claim, where signatures are not required.
    pub fn claimed(name: &str, tenant: &str) -> Self {
        Self {
            principal: Principal {
                name: name.to_owned(),
                tenant: tenant.to_owned(),
                roles: Vec::new(),
            },
            proof: Proof::Claimed,
            nonce: None,
        }
    }

    /// The principal's name as records show it.
    pub fn name(&self) -> &str {
        &self.principal.name
    }

    pub fn is_verified(&self) -> bool {
        !matches!(self.proof, Proof::Claimed)
    }
}

/// Why an operation was refused; said to the publisher's logs, the dead letter and the audit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Refusal {
    pub reason: String,
    /// The principal, when the signature was good and something else refused it.
    pub principal: Option<String>,
}

impl Refusal {
    fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            principal: None,
        }
    }
}

/// A message as the gate sees it.
#[derive(Debug, Clone, Copy)]
pub struct Presented<'a> {
    pub subject: &'a str,
    pub headers: Option<&'a HeaderMap>,
    pub payload: &'a [u8],
    /// When the broker stored it (unix ms), or now for a message that was never stored.
    pub stored_at_ms: u64,
}

/// The principals file, read: principals by public key.
#[derive(Debug, Clone, Default)]
pub struct PrincipalBook {
    by_key: HashMap<String, Principal>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BookFile {
    #[serde(default)]
    principals: Vec<BookEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BookEntry {
    name: String,
    tenant: String,
    #[serde(default)]
    roles: Vec<String>,
    key: String,
}

impl PrincipalBook {
    /// Reads a principals file; every mistake in it is an error naming the file and the entry.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the principals file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("principals file {}: {e}", path.display()))
    }

    /// Parses the TOML text of a principals file.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: BookFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut by_key = HashMap::new();
        for (i, entry) in file.principals.into_iter().enumerate() {
            let which = format!("principal {} ({})", i + 1, entry.name);
            crate::protocol::validate_token("principal name", &entry.name)
                .map_err(|f| format!("{which}: {}", f.message))?;
            if entry.tenant != EVERY_TENANT {
                crate::protocol::validate_token("tenant", &entry.tenant)
                    .map_err(|f| format!("{which}: {}", f.message))?;
            }
            let roles = entry
                .roles
                .iter()
                .map(|r| {
                    Role::parse(r).ok_or_else(|| {
                        format!("{which}: unknown role {r:?} (submit, approve, operate, delegate)")
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let key = entry.key.trim().to_owned();
            match nkeys::KeyPair::from_public_key(&key) {
                Ok(pair) if pair.key_pair_type() == nkeys::KeyPairType::User => {}
                _ => {
                    return Err(format!(
                        "{which}: key must be a public user nkey (starts with U; `skein keys new` makes one)"
                    ))
                }
            }
            let principal = Principal {
                name: entry.name,
                tenant: entry.tenant,
                roles,
            };
            if by_key.insert(key, principal).is_some() {
                return Err(format!("{which}: the same key is listed twice"));
            }
        }
        Ok(Self { by_key })
    }

    pub fn get(&self, key: &str) -> Option<&Principal> {
        self.by_key.get(key)
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

/// What a process checks operations against: the principals, whether a signature is required,
/// and how far a signature's time may lie from when its message was stored.
#[derive(Debug, Clone, Default)]
pub struct Gate {
    book: PrincipalBook,
    required: bool,
    window: Duration,
}

impl Gate {
    pub fn new(book: PrincipalBook, required: bool, window: Duration) -> Self {
        Self {
            book,
            required,
            window,
        }
    }

    /// A gate that requires nothing and knows nobody (a process without principals).
    pub fn open() -> Self {
        Self::new(PrincipalBook::default(), false, DEFAULT_SIGNATURE_WINDOW)
    }

    pub fn is_required(&self) -> bool {
        self.required
    }

    /// The principals it knows.
    pub fn book(&self) -> &PrincipalBook {
        &self.book
    }

    /// How long a nonce must be remembered to catch every replay the window lets through.
    pub fn nonce_memory(&self) -> Duration {
        self.window * 2
    }

    /// Who performs `operation` on `tenant`'s task through `message`, whose body names
    /// `claimed` as its author; or why it is refused. A message signed by a principal with the
    /// `operate` role in the tenant that replays a dead letter (`replayed`) may carry any
    /// operation.
    pub fn check(
        &self,
        message: Presented<'_>,
        tenant: &str,
        operation: Operation,
        claimed: &str,
        replayed: bool,
    ) -> Result<Acting, Refusal> {
        let header = |name: &str| {
            message
                .headers
                .and_then(|h| h.get(name))
                .map(|v| v.as_str())
        };
        if self.book.is_empty() && !self.required {
            // Nobody to check a signature against, and nothing required: a process without
            // principals takes every message at its word.
            return Ok(Acting::claimed(claimed, tenant));
        }
        let Some(key) = header(HEADER_PRINCIPAL) else {
            if self.required {
                return Err(Refusal::new(format!(
                    "unsigned {}: this cluster requires signed operations (set SKEIN_PRINCIPAL_KEY to a key listed in the principals file)",
                    operation.as_str()
                )));
            }
            return Ok(Acting::claimed(claimed, tenant));
        };
        let Some(signer) = self.book.get(key) else {
            return Err(Refusal::new(format!(
                "unknown principal key {key}: not in the principals file"
            )));
        };
        let refused = |reason: String| Refusal {
            reason,
            principal: Some(signer.name.clone()),
        };
        let fields = signature::Fields::read(message.headers).map_err(refused)?;
        let bytes = signed_bytes(message.subject, &fields.header_part(), message.payload);
        let verified = nkeys::KeyPair::from_public_key(key)
            .and_then(|pair| pair.verify(&bytes, &fields.signature));
        if verified.is_err() {
            return Err(refused(format!(
                "the signature of {} does not verify: forged, or the message was altered",
                signer.name
            )));
        }
        let skew = fields.signed_at_ms.abs_diff(message.stored_at_ms);
        if u128::from(skew) > self.window.as_millis() {
            return Err(refused(format!(
                "the signature of {} is expired: signed {} s from when the message was stored, more than the {} s allowed (a replay, or a clock that is off)",
                signer.name,
                skew / 1000,
                self.window.as_secs()
            )));
        }
        if !signer.covers(tenant) {
            return Err(refused(format!(
                "{} belongs to tenant {} and may not act on tenant {tenant}'s tasks",
                signer.name, signer.tenant
            )));
        }
        let nonce = Some((key.to_owned(), fields.nonce.clone()));
        let (principal, proof) = match fields.on_behalf_of {
            Some((name, roles)) => {
                if !signer.may(Role::Delegate) {
                    return Err(refused(format!(
                        "{} names someone it acts for but has no delegate role",
                        signer.name
                    )));
                }
                let principal = Principal {
                    name,
                    tenant: tenant.to_owned(),
                    roles,
                };
                let proof = Proof::Delegated {
                    by: signer.name.clone(),
                };
                (principal, proof)
            }
            None => (signer.clone(), Proof::Signed),
        };
        let replay_by_operator = replayed && principal.may(Role::Operate);
        let allowed = operation.allowed_roles();
        if !replay_by_operator && !allowed.iter().any(|role| principal.may(*role)) {
            let roles: Vec<&str> = allowed.iter().map(|r| r.as_str()).collect();
            return Err(Refusal {
                reason: format!(
                    "{} may not {}: that takes the role {}",
                    principal.name,
                    operation.as_str(),
                    roles.join(" or ")
                ),
                principal: Some(principal.name),
            });
        }
        Ok(Acting {
            principal,
            proof,
            nonce,
        })
    }
}

#[cfg(test)]
mod tests;
