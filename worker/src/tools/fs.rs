//! Workspace file tools (`read_file`, `write_file`, `list_files`), confined to the session's
//! workspace, whichever [`WorkspaceStore`] holds it (the NATS object store or a directory).
//!
//! Invariants:
//! - every path a model gives is parsed into a [`WorkspacePath`] before the store sees it: it
//!   must be relative, free of `..`, NUL and control characters; every refusal is
//!   [`ToolError::Denied`] (the volume store also refuses paths that leave through links);
//! - the session is the task's tenant and `workspace`, re-validated as tokens by the store;
//! - writes are whole-file and all-or-nothing; an append reads the file and writes it back
//!   conditionally, so a concurrent change is never lost (it is tried again);
//! - messages name paths as the model gave them, never the host's absolute paths.

use std::sync::Arc;

use bytes::Bytes;
use schemars::JsonSchema;
use serde::Deserialize;
use skein_common::protocol::ToolEffects;
use skein_common::workspace::{human_size, WorkspaceError, WorkspacePath};

use super::{trim_partial_utf8, Tool, ToolContext, ToolError};
use crate::workspace::WorkspaceStore;

/// The volume mode's path resolver (kept here for the fuzz target and older callers).
pub use crate::workspace::volume::Workspace;

/// How many times a read-modify-write (an append, an edit) starts over when the file changed
/// under it.
pub(crate) const CONFLICT_RETRIES: usize = 3;

/// Reads a file of the session workspace.
#[derive(Debug, Clone)]
pub struct ReadFile {
    store: Arc<dyn WorkspaceStore>,
    max_read_bytes: usize,
}

impl ReadFile {
    pub fn new(store: Arc<dyn WorkspaceStore>, max_read_bytes: usize) -> Self {
        Self {
            store,
            max_read_bytes,
        }
    }
}

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// Path of the file, relative to the workspace.
    pub path: String,
    /// Byte offset to start reading at (default 0).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Most bytes to return (default and ceiling: the worker's read limit).
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

impl Tool for ReadFile {
    const NAME: &'static str = "read_file";
    type Args = ReadFileArgs;

    fn effects(&self) -> ToolEffects {
        ToolEffects::READ_ONLY
    }

    fn description(&self) -> String {
        format!(
            "Read a text file from the session workspace. Returns at most {} bytes per call; \
             use `offset` to continue a long file.",
            self.max_read_bytes
        )
    }

    async fn call(&self, args: ReadFileArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        let path = WorkspacePath::parse(&args.path)?;
        let content = self.store.read(ctx.origin, &path).await?.bytes;
        let len = content.len() as u64;
        let offset = args.offset.unwrap_or(0);
        if offset > len {
            return Err(ToolError::InvalidArguments(format!(
                "offset {offset} is past the end of {} ({len} bytes)",
                args.path
            )));
        }
        let cap = args.max_bytes.map_or(self.max_read_bytes, |m| {
            usize::try_from(m)
                .unwrap_or(usize::MAX)
                .min(self.max_read_bytes)
        });
        // `offset <= len`, which is a `usize`.
        let start = usize::try_from(offset).unwrap_or(content.len());
        let end = start.saturating_add(cap).min(content.len());
        let mut bytes = content[start..end].to_vec();
        if end < content.len() {
            trim_partial_utf8(&mut bytes);
        }
        let end = offset + bytes.len() as u64;
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if end < len {
            text.push_str(&format!(
                "\n[showing bytes {offset}..{end} of {len}; read again with offset={end} for more]"
            ));
        }
        Ok(text)
    }
}

/// Writes a file of the session workspace.
#[derive(Debug, Clone)]
pub struct WriteFile {
    store: Arc<dyn WorkspaceStore>,
}

impl WriteFile {
    pub fn new(store: Arc<dyn WorkspaceStore>) -> Self {
        Self { store }
    }
}

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// Path of the file, relative to the workspace; missing directories are created.
    pub path: String,
    /// The text to write.
    pub content: String,
    /// Add to the end of the file instead of replacing it (default false).
    #[serde(default)]
    pub append: Option<bool>,
}

impl Tool for WriteFile {
    const NAME: &'static str = "write_file";
    type Args = WriteFileArgs;

    fn description(&self) -> String {
        format!(
            "Write a text file in the session workspace, creating missing directories. Replaces \
             the file unless `append` is true. A file may hold at most {}.",
            human_size(self.store.limits().max_file_bytes)
        )
    }

    /// Two writes to one file at once would race.
    fn concurrency_safe(&self) -> bool {
        false
    }

    /// Replacing a file loses what it held.
    fn effects(&self) -> ToolEffects {
        ToolEffects::EDITS_WORKSPACE
    }

    async fn call(&self, args: WriteFileArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        let path = WorkspacePath::parse(&args.path)?;
        let limits = self.store.limits();
        if args.content.len() as u64 > limits.max_file_bytes {
            return Err(ToolError::TooLarge(format!(
                "content is {} bytes; a workspace file may hold at most {}",
                args.content.len(),
                human_size(limits.max_file_bytes)
            )));
        }
        let written = args.content.len();
        if !args.append.unwrap_or(false) {
            self.store
                .write(ctx.origin, &path, Bytes::from(args.content), None)
                .await?;
        } else {
            let mut attempt = 0;
            loop {
                let (mut content, revision) = match self.store.read(ctx.origin, &path).await {
                    Ok(current) => (current.bytes.to_vec(), Some(current.revision)),
                    Err(WorkspaceError::NotFound(_)) => (Vec::new(), None),
                    Err(other) => return Err(other.into()),
                };
                content.extend_from_slice(args.content.as_bytes());
                match self
                    .store
                    .write(ctx.origin, &path, content.into(), revision.as_ref())
                    .await
                {
                    Ok(()) => break,
                    Err(WorkspaceError::Conflict(_)) if attempt < CONFLICT_RETRIES => attempt += 1,
                    Err(other) => return Err(other.into()),
                }
            }
        }
        Ok(format!("wrote {written} bytes to {}", args.path))
    }
}

/// Lists a directory of the session workspace.
#[derive(Debug, Clone)]
pub struct ListFiles {
    store: Arc<dyn WorkspaceStore>,
}

impl ListFiles {
    pub fn new(store: Arc<dyn WorkspaceStore>) -> Self {
        Self { store }
    }
}

/// Arguments of `list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// Directory to list, relative to the workspace (default ".", the workspace itself).
    #[serde(default)]
    pub path: Option<String>,
}

impl Tool for ListFiles {
    const NAME: &'static str = "list_files";
    type Args = ListFilesArgs;

    fn effects(&self) -> ToolEffects {
        ToolEffects::READ_ONLY
    }

    fn description(&self) -> String {
        "List a directory of the session workspace: one entry per line, sorted, directories \
         ending in `/`."
            .to_owned()
    }

    async fn call(&self, args: ListFilesArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        let relative = args.path.as_deref().unwrap_or(".");
        let dir = WorkspacePath::parse(relative)?;
        let entries = self.store.list_dir(ctx.origin, &dir).await?;
        if entries.is_empty() {
            return Ok("(empty)".to_owned());
        }
        let names: Vec<String> = entries
            .into_iter()
            .map(|e| {
                if e.is_dir {
                    format!("{}/", e.name)
                } else {
                    e.name
                }
            })
            .collect();
        Ok(names.join("\n"))
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! A registry of the workspace tools over a volume store in a temporary directory.

    use std::path::PathBuf;
    use std::sync::Arc;

    use serde_json::Value;
    use skein_common::workspace::Limits;

    use crate::tools::test_support::{origin, scope, TestDir};
    use crate::tools::{ToolContext, ToolError, ToolRegistry};
    use crate::workspace::{VolumeFiles, WorkspaceStore};

    pub struct Fixture {
        pub dir: TestDir,
        pub registry: ToolRegistry,
    }

    impl Fixture {
        pub fn new(max_read_bytes: usize, limits: Limits) -> Self {
            let dir = TestDir::new();
            let store: Arc<dyn WorkspaceStore> =
                Arc::new(VolumeFiles::new(dir.path().join("workspaces"), limits));
            let mut registry = ToolRegistry::new();
            registry.register(super::ReadFile::new(store.clone(), max_read_bytes));
            registry.register(super::WriteFile::new(store.clone()));
            registry.register(super::ListFiles::new(store.clone()));
            registry.register(crate::tools::edit::EditFile::new(store.clone()));
            registry.register(crate::tools::glob::GlobFiles::new(store.clone()));
            registry.register(crate::tools::grep::GrepFiles::new(store));
            Self { dir, registry }
        }

        pub fn workspace(&self, tenant: &str, session: &str) -> PathBuf {
            self.dir
                .path()
                .join("workspaces")
                .join(tenant)
                .join(session)
        }

        pub async fn call_as(
            &self,
            session: &str,
            tool: &str,
            arguments: Value,
        ) -> Result<String, ToolError> {
            let mut scope = scope(&self.dir);
            let origin = origin("acme", session);
            let ctx = ToolContext {
                origin: &origin,
                call_id: "c1",
                idempotency_key: "key-1",
                time_limit: std::time::Duration::from_secs(60),
                scope: &mut scope,
            };
            let result = self.registry.call(tool, arguments, ctx).await;
            scope.close().await.expect("scope closes");
            result
        }

        pub async fn call(&self, tool: &str, arguments: Value) -> Result<String, ToolError> {
            self.call_as("s1", tool, arguments).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::Fixture;
    use super::*;
    use crate::tools::test_support::origin;
    use serde_json::json;
    use skein_common::workspace::Limits;
    use std::path::Path;

    fn fixture(max_read_bytes: usize) -> Fixture {
        Fixture::new(max_read_bytes, Limits::default())
    }

    fn assert_denied(result: Result<String, ToolError>, what: &str) {
        match result {
            Err(ToolError::Denied(message)) => {
                assert!(
                    message.contains("path escapes the workspace"),
                    "{what}: {message}"
                )
            }
            other => panic!("{what}: expected Denied, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn write_read_list_round_trip() {
        let fx = fixture(1024);
        assert_eq!(fx.call("list_files", json!({})).await, Ok("(empty)".into()));
        let wrote = fx
            .call(
                "write_file",
                json!({"path": "notes/a.txt", "content": "hello"}),
            )
            .await;
        assert_eq!(wrote, Ok("wrote 5 bytes to notes/a.txt".into()));
        fx.call(
            "write_file",
            json!({"path": "notes/a.txt", "content": " world", "append": true}),
        )
        .await
        .expect("append");
        fx.call("write_file", json!({"path": "b.txt", "content": "b"}))
            .await
            .expect("write b");
        assert_eq!(
            fx.call("read_file", json!({"path": "./notes/a.txt"})).await,
            Ok("hello world".into())
        );
        assert_eq!(
            fx.call("list_files", json!({"path": "."})).await,
            Ok("b.txt\nnotes/".into())
        );
        assert_eq!(
            fx.call("list_files", json!({"path": "notes"})).await,
            Ok("a.txt".into())
        );
        assert!(fx.workspace("acme", "s1").join("notes/a.txt").is_file());
        // Nothing left behind by the all-or-nothing writes.
        let names: Vec<_> = std::fs::read_dir(fx.workspace("acme", "s1").join("notes"))
            .expect("lists")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["a.txt"]);
    }

    #[tokio::test]
    async fn reads_are_capped_and_resumable() {
        let fx = fixture(4);
        fx.call("write_file", json!({"path": "f", "content": "abcdefghij"}))
            .await
            .expect("write");
        let first = fx
            .call("read_file", json!({"path": "f"}))
            .await
            .expect("read");
        assert_eq!(
            first,
            "abcd\n[showing bytes 0..4 of 10; read again with offset=4 for more]"
        );
        let rest = fx
            .call(
                "read_file",
                json!({"path": "f", "offset": 8, "max_bytes": 100}),
            )
            .await;
        assert_eq!(rest, Ok("ij".into()));
        let past = fx
            .call("read_file", json!({"path": "f", "offset": 11}))
            .await;
        assert!(
            matches!(past, Err(ToolError::InvalidArguments(ref m)) if m.contains("past the end")),
            "{past:?}"
        );
        let missing = fx.call("read_file", json!({"path": "nope.txt"})).await;
        assert!(
            matches!(missing, Err(ToolError::NotFound(_))),
            "{missing:?}"
        );
        let dir = fx.call("read_file", json!({"path": "."})).await;
        assert!(
            matches!(dir, Err(ToolError::InvalidArguments(ref m)) if m.contains("is a directory")),
            "{dir:?}"
        );
    }

    #[tokio::test]
    async fn files_and_sessions_over_their_caps_are_too_large() {
        let fx = Fixture::new(
            1024,
            Limits {
                max_file_bytes: 10,
                max_session_bytes: 15,
            },
        );
        let big = fx
            .call(
                "write_file",
                json!({"path": "big", "content": "x".repeat(11)}),
            )
            .await;
        assert!(
            matches!(big, Err(ToolError::TooLarge(ref m)) if m.contains("at most 10 B")),
            "{big:?}"
        );
        fx.call(
            "write_file",
            json!({"path": "a", "content": "x".repeat(10)}),
        )
        .await
        .expect("fits");
        let grown = fx
            .call(
                "write_file",
                json!({"path": "a", "content": "y", "append": true}),
            )
            .await;
        assert!(matches!(grown, Err(ToolError::TooLarge(_))), "{grown:?}");
        let session = fx
            .call("write_file", json!({"path": "b", "content": "x".repeat(6)}))
            .await;
        assert!(
            matches!(session, Err(ToolError::TooLarge(ref m)) if m.contains("session")),
            "{session:?}"
        );
        // Replacing a file counts its new size, not both.
        fx.call("write_file", json!({"path": "a", "content": "x".repeat(9)}))
            .await
            .expect("a replacement within the caps");
        assert_eq!(
            fx.call("read_file", json!({"path": "a"})).await,
            Ok("x".repeat(9))
        );
    }

    #[tokio::test]
    async fn paths_outside_the_workspace_are_denied() {
        let fx = fixture(1024);
        for path in ["../x", "/etc/passwd", "a/../../x", "a/..", "x\0y"] {
            assert_denied(fx.call("read_file", json!({"path": path})).await, path);
            assert_denied(
                fx.call("write_file", json!({"path": path, "content": "x"}))
                    .await,
                path,
            );
        }
        let empty = fx.call("read_file", json!({"path": ""})).await;
        assert!(matches!(empty, Err(ToolError::Denied(_))), "{empty:?}");
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn symlinks_out_of_the_workspace_are_denied() {
        let fx = fixture(1024);
        let outside = fx.dir.path().join("outside");
        std::fs::create_dir_all(&outside).expect("outside dir");
        std::fs::write(outside.join("secret"), "secret").expect("secret");
        let workspace = fx.workspace("acme", "s1");
        std::fs::create_dir_all(&workspace).expect("workspace");
        std::os::unix::fs::symlink(outside.join("secret"), workspace.join("link"))
            .expect("file link");
        std::os::unix::fs::symlink(&outside, workspace.join("out")).expect("dir link");

        assert_denied(fx.call("read_file", json!({"path": "link"})).await, "link");
        assert_denied(
            fx.call("read_file", json!({"path": "out/secret"})).await,
            "out/secret",
        );
        assert_denied(
            fx.call("write_file", json!({"path": "out/new", "content": "x"}))
                .await,
            "out/new",
        );
        assert_denied(
            fx.call(
                "write_file",
                json!({"path": "out/deep/new", "content": "x"}),
            )
            .await,
            "out/deep/new",
        );
        assert_denied(
            fx.call("write_file", json!({"path": "link", "content": "x"}))
                .await,
            "link",
        );
        assert_denied(fx.call("list_files", json!({"path": "out"})).await, "out");
        assert!(!outside.join("new").exists() && !outside.join("deep").exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("secret")).expect("secret"),
            "secret"
        );
        // Searches do not follow links either.
        let grep = fx
            .call("grep_files", json!({"pattern": "secret"}))
            .await
            .expect("grep runs");
        assert!(!grep.contains("link:"), "{grep}");
    }

    /// A target that is itself a link is refused even when the link points inside the workspace:
    /// between the check and the use it could be pointed elsewhere.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_link_that_points_inside_the_workspace_is_refused_too() {
        let fx = fixture(1024);
        let workspace = fx.workspace("acme", "s1");
        std::fs::create_dir_all(&workspace).expect("workspace");
        std::fs::write(workspace.join("notes.txt"), "notes").expect("a file");
        std::os::unix::fs::symlink("notes.txt", workspace.join("alias")).expect("file link");

        assert_denied(
            fx.call("read_file", json!({"path": "alias"})).await,
            "alias",
        );
        assert_denied(
            fx.call("write_file", json!({"path": "alias", "content": "x"}))
                .await,
            "alias",
        );
        assert_eq!(
            std::fs::read_to_string(workspace.join("notes.txt")).expect("notes"),
            "notes"
        );
        assert!(std::fs::symlink_metadata(workspace.join("alias"))
            .expect("the link stays")
            .file_type()
            .is_symlink());
    }

    #[tokio::test]
    async fn sessions_of_one_tenant_are_isolated() {
        let fx = fixture(1024);
        fx.call_as(
            "s1",
            "write_file",
            json!({"path": "mine.txt", "content": "1"}),
        )
        .await
        .expect("s1 writes");
        let other = fx
            .call_as("s2", "read_file", json!({"path": "mine.txt"}))
            .await;
        assert!(matches!(other, Err(ToolError::NotFound(_))), "{other:?}");
        assert_eq!(
            fx.call_as("s2", "list_files", json!({})).await,
            Ok("(empty)".into())
        );
        assert_denied(
            fx.call_as("s2", "read_file", json!({"path": "../s1/mine.txt"}))
                .await,
            "../s1/mine.txt",
        );
    }

    #[test]
    fn bad_origins_are_refused() {
        let root = Path::new("/tmp/root");
        assert!(Workspace::for_session(root, &origin("acme", "s1")).is_ok());
        for (tenant, session) in [("..", "s1"), ("acme", "a/b"), ("", "s1"), ("acme", ".")] {
            let result = Workspace::for_session(root, &origin(tenant, session));
            assert!(
                matches!(result, Err(WorkspaceError::Denied(_))),
                "{tenant}/{session}"
            );
        }
    }
}
