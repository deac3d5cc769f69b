//! Session workspaces in the NATS object store, shared by the workers' file tools and the
//! `skein workspace` command: which files a session has, reading and writing them whole, and the
//! rules every backend applies (paths, size caps).
//!
//! Layout:
//! - [`path`]: which path texts are allowed and their normal form ([`WorkspacePath`]);
//! - [`objects`]: [`ObjectWorkspaces`], the files of every session in one bucket per tenant;
//! - [`cache`]: [`ContentCache`], contents already fetched, used only for the version they are.
//!
//! Invariants:
//! - tenant and session are validated tokens ([`SessionRef::new`]) before any name is built from
//!   them, so no session reaches another's objects and no tenant another's bucket;
//! - the caps ([`Limits`]) hold for every write: a file is at most `max_file_bytes`, a session's
//!   files together at most `max_session_bytes`; a write that would break either is refused
//!   whole ([`WorkspaceError::TooLarge`]);
//! - a write is all-or-nothing: readers see the previous content or the new one, never a mix.

pub mod cache;
pub mod objects;
pub mod path;

use clap::Args;

use crate::config::{
    ENV_WORKSPACE_BUCKET_BYTES, ENV_WORKSPACE_MAX_FILE_BYTES, ENV_WORKSPACE_MAX_SESSION_BYTES,
    ENV_WORKSPACE_REPLICAS, ENV_WORKSPACE_VERSIONS, MAX_REPLICAS,
};
use crate::protocol::validate_token;

pub use cache::{ContentCache, ContentId};
pub use objects::{ObjectWorkspaces, StoredFile, Version};
pub use path::WorkspacePath;

/// Largest file of a session unless configured otherwise.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// Largest total of a session's files unless configured otherwise.
pub const DEFAULT_MAX_SESSION_BYTES: u64 = 256 * 1024 * 1024;

/// Earlier versions kept per file unless configured otherwise: as many as the turns a session
/// keeps records of (`SKEIN_SESSION_CHECKPOINTS`), so a file written once a turn reaches every
/// fork point.
pub const DEFAULT_WORKSPACE_VERSIONS: usize = 50;

/// Why a workspace operation failed, by condition.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkspaceError {
    /// A path or name the rules refuse (it escapes the workspace, it is not a token...).
    #[error("{0}")]
    Denied(String),
    /// No such file or directory.
    #[error("{0}")]
    NotFound(String),
    /// The request does not fit what is there (a directory where a file is expected...).
    #[error("{0}")]
    Invalid(String),
    /// A cap would be exceeded.
    #[error("{0}")]
    TooLarge(String),
    /// The file changed while the operation ran; nothing was written.
    #[error("{0}")]
    Conflict(String),
    /// The store could not be reached or answered with an error; trying again may work.
    #[error("{message}")]
    Unavailable {
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl WorkspaceError {
    /// An [`Unavailable`](Self::Unavailable) error caused by `source`.
    pub fn unavailable(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Unavailable {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// The message with its causes, for a person or a model.
    pub fn describe(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        text
    }
}

/// One session's workspace: a tenant and a session, both validated tokens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionRef {
    tenant: String,
    session: String,
}

impl SessionRef {
    /// Checks both as tokens (`A-Z a-z 0-9 _ -`, 1 to 128 characters).
    pub fn new(tenant: &str, session: &str) -> Result<Self, WorkspaceError> {
        validate_token("tenant", tenant).map_err(|f| WorkspaceError::Denied(f.message))?;
        validate_token("workspace", session).map_err(|f| WorkspaceError::Denied(f.message))?;
        Ok(Self {
            tenant: tenant.to_owned(),
            session: session.to_owned(),
        })
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    pub fn session(&self) -> &str {
        &self.session
    }
}

/// Size caps of every workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest file.
    pub max_file_bytes: u64,
    /// Largest total of one session's files.
    pub max_session_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_session_bytes: DEFAULT_MAX_SESSION_BYTES,
        }
    }
}

impl Limits {
    /// Refuses a file of `size` bytes.
    pub fn check_file(&self, path: &WorkspacePath, size: u64) -> Result<(), WorkspaceError> {
        if size > self.max_file_bytes {
            return Err(WorkspaceError::TooLarge(format!(
                "{path} would be {} ({size} bytes); a workspace file may have at most {} \
                 ({} bytes)",
                human_size(size),
                human_size(self.max_file_bytes),
                self.max_file_bytes
            )));
        }
        Ok(())
    }

    /// Refuses a session whose files would total `total` bytes.
    pub fn check_session(&self, total: u64) -> Result<(), WorkspaceError> {
        if total > self.max_session_bytes {
            return Err(WorkspaceError::TooLarge(format!(
                "the session's files would total {} ({total} bytes); a session workspace may \
                 hold at most {} ({} bytes): remove or shorten files first",
                human_size(total),
                human_size(self.max_session_bytes),
                self.max_session_bytes
            )));
        }
        Ok(())
    }
}

/// Settings of the object-store workspaces, shared by workers and the `skein workspace` command.
#[derive(Debug, Clone, Args)]
pub struct WorkspaceStoreConfig {
    /// Largest file of a session workspace (bytes, or with a KiB, MiB or GiB suffix).
    #[arg(long = "workspace-max-file", env = ENV_WORKSPACE_MAX_FILE_BYTES, default_value = "8MiB", value_parser = parse_size)]
    pub max_file_bytes: u64,
    /// Largest total of one session workspace's files (bytes, or with a KiB, MiB or GiB suffix).
    #[arg(long = "workspace-max-session", env = ENV_WORKSPACE_MAX_SESSION_BYTES, default_value = "256MiB", value_parser = parse_size)]
    pub max_session_bytes: u64,
    /// Replicas of a tenant's workspace bucket (object mode; 1 to 5, at most the NATS cluster's
    /// size); an existing bucket with fewer is raised to them. Unset: the stream replicas
    /// (`SKEIN_STREAM_REPLICAS`).
    #[arg(long = "workspace-replicas", env = ENV_WORKSPACE_REPLICAS)]
    pub replicas: Option<usize>,
    /// Most bytes one tenant's workspace bucket may hold (object mode; bytes, or with a KiB, MiB
    /// or GiB suffix): its stream's byte limit, so that one tenant cannot fill the JetStream
    /// store that every tenant's submissions share. Set on the buckets created and, by the
    /// processes that create buckets, on existing ones. Unset: no limit of its own.
    #[arg(long = "workspace-bucket-bytes", env = ENV_WORKSPACE_BUCKET_BYTES, value_parser = parse_size)]
    pub bucket_bytes: Option<u64>,
    /// Earlier versions kept per file (object mode), so a fork gets a session's files as they
    /// were at its point; 0 keeps none (a replaced version is purged at once).
    #[arg(long = "workspace-versions", env = ENV_WORKSPACE_VERSIONS, default_value_t = DEFAULT_WORKSPACE_VERSIONS)]
    pub versions: usize,
}

impl Default for WorkspaceStoreConfig {
    fn default() -> Self {
        Self {
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_session_bytes: DEFAULT_MAX_SESSION_BYTES,
            replicas: None,
            bucket_bytes: None,
            versions: DEFAULT_WORKSPACE_VERSIONS,
        }
    }
}

impl WorkspaceStoreConfig {
    /// Checks values clap cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_file_bytes == 0 {
            return Err("workspace max file size must be at least 1 byte".into());
        }
        if self.max_session_bytes < self.max_file_bytes {
            return Err(format!(
                "workspace max session size ({}) must be at least the max file size ({})",
                self.max_session_bytes, self.max_file_bytes
            ));
        }
        if let Some(bytes) = self.bucket_bytes {
            if bytes < self.max_session_bytes {
                return Err(format!(
                    "workspace bucket bytes ({bytes}) must be at least the max session size ({})",
                    self.max_session_bytes
                ));
            }
        }
        if let Some(replicas) = self.replicas {
            if !(1..=MAX_REPLICAS).contains(&replicas) {
                return Err(format!(
                    "workspace replicas must be 1 to {MAX_REPLICAS}, got {replicas}"
                ));
            }
        }
        Ok(())
    }

    /// Replicas of the buckets: the setting, else `stream_replicas`.
    pub fn bucket_replicas(&self, stream_replicas: usize) -> usize {
        self.replicas.unwrap_or(stream_replicas)
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_file_bytes: self.max_file_bytes,
            max_session_bytes: self.max_session_bytes,
        }
    }
}

/// Parses a size: a number of bytes, optionally followed by `K`/`KiB`, `M`/`MiB` or `G`/`GiB`
/// (powers of 1024; case-insensitive).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (say 8MiB or 8388608)"))?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// A size for people: `512 B`, `3.0 KiB`, `8.0 MiB`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 3] = ["KiB", "MiB", "GiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// The object store's digest of `content`: `SHA-256=` and the URL-safe base64 of its SHA-256.
pub fn digest(content: &[u8]) -> String {
    use base64::Engine;
    use sha2::Digest;
    let hash = sha2::Sha256::digest(content);
    format!(
        "SHA-256={}",
        base64::engine::general_purpose::URL_SAFE.encode(hash)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("8388608"), Ok(8 * 1024 * 1024));
        assert_eq!(parse_size("8MiB"), Ok(8 * 1024 * 1024));
        assert_eq!(parse_size("256 mib"), Ok(256 * 1024 * 1024));
        assert_eq!(parse_size("64K"), Ok(64 * 1024));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("8 parsecs").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }

    #[test]
    fn a_bucket_limit_holds_a_whole_session() {
        let cfg = WorkspaceStoreConfig {
            bucket_bytes: Some(DEFAULT_MAX_SESSION_BYTES - 1),
            ..WorkspaceStoreConfig::default()
        };
        assert!(cfg
            .validate()
            .is_err_and(|e| e.contains("workspace bucket bytes")));
        let cfg = WorkspaceStoreConfig {
            bucket_bytes: Some(DEFAULT_MAX_SESSION_BYTES),
            ..WorkspaceStoreConfig::default()
        };
        assert_eq!(cfg.validate(), Ok(()));
    }

    #[test]
    fn caps_name_the_limit() {
        let limits = Limits {
            max_file_bytes: 10,
            max_session_bytes: 20,
        };
        let path = WorkspacePath::parse("a.txt").expect("valid");
        assert!(limits.check_file(&path, 10).is_ok());
        let file = limits.check_file(&path, 11).expect_err("too large");
        assert!(
            matches!(&file, WorkspaceError::TooLarge(m) if m.contains("a.txt") && m.contains("at most 10 B")),
            "{file}"
        );
        let session = limits.check_session(21).expect_err("too large");
        assert!(
            matches!(&session, WorkspaceError::TooLarge(m) if m.contains("at most 20 B")),
            "{session}"
        );
    }

    #[test]
    fn sessions_are_tokens() {
        assert!(SessionRef::new("acme", "s-1").is_ok());
        for (tenant, session) in [("..", "s1"), ("acme", "a/b"), ("", "s1"), ("acme", "a.b")] {
            assert!(
                matches!(
                    SessionRef::new(tenant, session),
                    Err(WorkspaceError::Denied(_))
                ),
                "{tenant}/{session}"
            );
        }
    }

    #[test]
    fn digests_match_the_object_store_format() {
        // SHA-256 of the empty string, URL-safe base64 with padding.
        assert_eq!(
            digest(b""),
            "SHA-256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU="
        );
        assert_eq!(human_size(8 * 1024 * 1024), "8.0 MiB");
        assert_eq!(human_size(512), "512 B");
    }
}
