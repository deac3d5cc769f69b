//! Workspace file tools (`read_file`, `write_file`, `list_files`), confined to the session's
//! workspace `{workspace_root}/{tenant}/{session}`.
//!
//! Invariants:
//! - every path a model gives goes through [`Workspace::resolve`] before any file operation: it
//!   must be relative, free of `..` and NUL, and the deepest part of it that exists must
//!   canonicalize to a place inside the canonical workspace directory; a target that is itself a
//!   symbolic link is refused. Every refusal is [`ToolError::Denied`];
//! - tenant and session are re-validated as tokens, so two sessions (or tenants) never share a
//!   directory, and the workspace directory is created on first use;
//! - messages name paths as the model gave them, never the host's absolute paths.
//!
//! Limit: the check and the use are two steps. These tools never create symbolic links, so a link
//! can only appear between them if something else running in the same workspace makes one; a tool
//! that runs arbitrary commands there would need an OS-level sandbox instead.

use std::io::SeekFrom;
use std::path::{Component, Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;
use skein_common::protocol::{validate_token, TaskOrigin};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use super::{trim_partial_utf8, Tool, ToolContext, ToolError};
use skein_common::protocol::ToolEffects;

/// Largest content `write_file` accepts.
pub const MAX_WRITE_BYTES: usize = 1024 * 1024;

/// One session's workspace directory.
#[derive(Debug, Clone)]
pub struct Workspace {
    dir: PathBuf,
}

impl Workspace {
    /// The workspace of `origin`'s session under `root` (not created yet).
    pub fn for_session(root: &Path, origin: &TaskOrigin) -> Result<Self, ToolError> {
        validate_token("tenant", &origin.tenant).map_err(|f| ToolError::Denied(f.message))?;
        validate_token("workspace", &origin.workspace).map_err(|f| ToolError::Denied(f.message))?;
        Ok(Self {
            dir: root.join(&origin.tenant).join(&origin.workspace),
        })
    }

    /// The workspace directory (not canonicalized).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Maps `relative` to a path inside the workspace, creating the workspace directory if
    /// needed. `"."` is the workspace itself. See the module invariants for what is refused.
    pub async fn resolve(&self, relative: &str) -> Result<PathBuf, ToolError> {
        let cleaned = clean_relative(relative)?;
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(|e| ToolError::Failed(format!("could not create the workspace: {e}")))?;
        let root = tokio::fs::canonicalize(&self.dir)
            .await
            .map_err(|e| ToolError::Failed(format!("could not resolve the workspace: {e}")))?;
        if cleaned.as_os_str().is_empty() {
            return Ok(root);
        }
        let target = root.join(&cleaned);
        if let Ok(meta) = tokio::fs::symlink_metadata(&target).await {
            if meta.file_type().is_symlink() {
                return Err(escapes(relative, "it is a symbolic link"));
            }
        }
        // The deepest existing ancestor decides: below it, only plain directories can be created.
        for ancestor in target.ancestors() {
            match tokio::fs::symlink_metadata(ancestor).await {
                Ok(_) => {
                    let real = tokio::fs::canonicalize(ancestor)
                        .await
                        .map_err(|_| escapes(relative, "it goes through a broken link"))?;
                    if !real.starts_with(&root) {
                        return Err(escapes(relative, "it leads outside through a link"));
                    }
                    return Ok(target);
                }
                Err(e) if is_missing(&e) => continue,
                Err(e) => return Err(io_error(relative, e)),
            }
        }
        // `root` is an ancestor of `target` and exists, so the loop always returns.
        Err(escapes(relative, "no part of it exists"))
    }
}

/// The normal components of `relative`; empty for `"."`.
fn clean_relative(relative: &str) -> Result<PathBuf, ToolError> {
    if relative.is_empty() {
        return Err(ToolError::Denied(
            "empty path: give a path relative to the workspace".to_owned(),
        ));
    }
    if relative.contains('\0') {
        return Err(escapes(relative, "it contains a NUL byte"));
    }
    let mut cleaned = PathBuf::new();
    for component in Path::new(relative).components() {
        match component {
            Component::Normal(part) => cleaned.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(escapes(relative, "`..` is not allowed")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(escapes(relative, "absolute paths are not allowed"))
            }
        }
    }
    Ok(cleaned)
}

fn escapes(relative: &str, why: &str) -> ToolError {
    ToolError::Denied(format!(
        "path escapes the workspace: {relative:?} ({why}); use a path relative to the workspace"
    ))
}

fn is_missing(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

fn io_error(relative: &str, e: std::io::Error) -> ToolError {
    match e.kind() {
        std::io::ErrorKind::NotFound => {
            ToolError::NotFound(format!("{relative}: no such file or directory"))
        }
        std::io::ErrorKind::PermissionDenied => {
            ToolError::Denied(format!("{relative}: permission denied"))
        }
        _ => ToolError::Failed(format!("{relative}: {e}")),
    }
}

/// Reads a file of the session workspace.
#[derive(Debug, Clone)]
pub struct ReadFile {
    root: PathBuf,
    max_read_bytes: usize,
}

impl ReadFile {
    pub fn new(workspace_root: PathBuf, max_read_bytes: usize) -> Self {
        Self {
            root: workspace_root,
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
        ToolEffects {
            read_only: true,
            ..ToolEffects::default()
        }
    }

    fn description(&self) -> String {
        format!(
            "Read a text file from the session workspace. Returns at most {} bytes per call; \
             use `offset` to continue a long file.",
            self.max_read_bytes
        )
    }

    async fn call(&self, args: ReadFileArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        let workspace = Workspace::for_session(&self.root, ctx.origin)?;
        let path = workspace.resolve(&args.path).await?;
        let meta = tokio::fs::metadata(&path)
            .await
            .map_err(|e| io_error(&args.path, e))?;
        if meta.is_dir() {
            return Err(ToolError::InvalidArguments(format!(
                "{} is a directory; use list_files",
                args.path
            )));
        }
        let len = meta.len();
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
        let mut file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| io_error(&args.path, e))?;
        file.seek(SeekFrom::Start(offset))
            .await
            .map_err(|e| io_error(&args.path, e))?;
        let mut bytes = Vec::with_capacity(cap.min(usize::try_from(len - offset).unwrap_or(cap)));
        file.take(u64::try_from(cap).unwrap_or(u64::MAX))
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| io_error(&args.path, e))?;
        let mut end = offset + bytes.len() as u64;
        if end < len {
            trim_partial_utf8(&mut bytes);
            end = offset + bytes.len() as u64;
        }
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
    root: PathBuf,
}

impl WriteFile {
    pub fn new(workspace_root: PathBuf) -> Self {
        Self {
            root: workspace_root,
        }
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
             the file unless `append` is true. At most {MAX_WRITE_BYTES} bytes per call."
        )
    }

    /// Two writes to one file at once would interleave.
    fn concurrency_safe(&self) -> bool {
        false
    }

    /// Replacing a file loses what it held.
    fn effects(&self) -> ToolEffects {
        ToolEffects {
            destructive: true,
            edits_workspace: true,
            ..ToolEffects::default()
        }
    }

    async fn call(&self, args: WriteFileArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        if args.content.len() > MAX_WRITE_BYTES {
            return Err(ToolError::TooLarge(format!(
                "content is {} bytes; write_file accepts at most {MAX_WRITE_BYTES}",
                args.content.len()
            )));
        }
        let workspace = Workspace::for_session(&self.root, ctx.origin)?;
        let path = workspace.resolve(&args.path).await?;
        let is_dir = tokio::fs::metadata(&path)
            .await
            .map(|m| m.is_dir())
            .unwrap_or(false);
        if is_dir {
            return Err(ToolError::InvalidArguments(format!(
                "{} is a directory",
                args.path
            )));
        }
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| io_error(&args.path, e))?;
        }
        let append = args.append.unwrap_or(false);
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .append(append)
            .truncate(!append)
            .open(&path)
            .await
            .map_err(|e| io_error(&args.path, e))?;
        file.write_all(args.content.as_bytes())
            .await
            .map_err(|e| io_error(&args.path, e))?;
        file.flush().await.map_err(|e| io_error(&args.path, e))?;
        Ok(format!(
            "wrote {} bytes to {}",
            args.content.len(),
            args.path
        ))
    }
}

/// Lists a directory of the session workspace.
#[derive(Debug, Clone)]
pub struct ListFiles {
    root: PathBuf,
}

impl ListFiles {
    pub fn new(workspace_root: PathBuf) -> Self {
        Self {
            root: workspace_root,
        }
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
        ToolEffects {
            read_only: true,
            ..ToolEffects::default()
        }
    }

    fn description(&self) -> String {
        "List a directory of the session workspace: one entry per line, sorted, directories \
         ending in `/`."
            .to_owned()
    }

    async fn call(&self, args: ListFilesArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        let relative = args.path.as_deref().unwrap_or(".");
        let workspace = Workspace::for_session(&self.root, ctx.origin)?;
        let dir = workspace.resolve(relative).await?;
        let meta = tokio::fs::metadata(&dir)
            .await
            .map_err(|e| io_error(relative, e))?;
        if !meta.is_dir() {
            return Err(ToolError::InvalidArguments(format!(
                "{relative} is a file; use read_file"
            )));
        }
        let mut reader = tokio::fs::read_dir(&dir)
            .await
            .map_err(|e| io_error(relative, e))?;
        let mut names = Vec::new();
        while let Some(entry) = reader
            .next_entry()
            .await
            .map_err(|e| io_error(relative, e))?
        {
            let mut name = entry.file_name().to_string_lossy().into_owned();
            // `file_type` does not follow links: a link to a directory is listed as a plain name.
            if entry.file_type().await.is_ok_and(|t| t.is_dir()) {
                name.push('/');
            }
            names.push(name);
        }
        if names.is_empty() {
            return Ok("(empty)".to_owned());
        }
        names.sort();
        Ok(names.join("\n"))
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use crate::tools::test_support::{origin, TestDir};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any path text: refused, or resolved to a path inside the workspace.
        #[test]
        fn the_path_resolver_never_panics_or_leaves_the_workspace(
            relative in prop_oneof![
                ".{0,40}",
                "(\\.\\.?/|/|[a-z]{1,3}/|\\\\|%2e|\u{0}){0,6}[a-z.]{0,8}",
            ]
        ) {
            let dir = TestDir::new();
            let workspace = Workspace::for_session(dir.path(), &origin("acme", "s1"))
                .expect("a valid workspace");
            if let Ok(cleaned) = clean_relative(&relative) {
                prop_assert!(cleaned.components().all(|c| matches!(c, Component::Normal(_))));
            }
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a runtime");
            if let Ok(path) = runtime.block_on(workspace.resolve(&relative)) {
                let root = std::fs::canonicalize(workspace.dir()).expect("the workspace exists");
                prop_assert!(path.starts_with(&root), "{path:?} outside {root:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_support::{origin, scope, TestDir};
    use crate::tools::ToolRegistry;
    use serde_json::{json, Value};

    struct Fixture {
        dir: TestDir,
        registry: ToolRegistry,
    }

    impl Fixture {
        fn new(max_read_bytes: usize) -> Self {
            let dir = TestDir::new();
            let root = dir.path().join("workspaces");
            let mut registry = ToolRegistry::new();
            registry.register(ReadFile::new(root.clone(), max_read_bytes));
            registry.register(WriteFile::new(root.clone()));
            registry.register(ListFiles::new(root));
            Self { dir, registry }
        }

        fn workspace(&self, tenant: &str, session: &str) -> PathBuf {
            self.dir
                .path()
                .join("workspaces")
                .join(tenant)
                .join(session)
        }

        async fn call_as(
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
                scope: &mut scope,
            };
            let result = self.registry.call(tool, arguments, ctx).await;
            scope.close().await.expect("scope closes");
            result
        }

        async fn call(&self, tool: &str, arguments: Value) -> Result<String, ToolError> {
            self.call_as("s1", tool, arguments).await
        }
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
        let fx = Fixture::new(1024);
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
    }

    #[tokio::test]
    async fn reads_are_capped_and_resumable() {
        let fx = Fixture::new(4);
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
        let missing = fx.call("read_file", json!({"path": "nope.txt"})).await;
        assert!(
            matches!(missing, Err(ToolError::NotFound(_))),
            "{missing:?}"
        );
    }

    #[tokio::test]
    async fn oversized_writes_are_too_large() {
        let fx = Fixture::new(16);
        let content = "x".repeat(MAX_WRITE_BYTES + 1);
        let result = fx
            .call("write_file", json!({"path": "big", "content": content}))
            .await;
        assert!(matches!(result, Err(ToolError::TooLarge(_))), "{result:?}");
    }

    #[tokio::test]
    async fn paths_outside_the_workspace_are_denied() {
        let fx = Fixture::new(1024);
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
        let fx = Fixture::new(1024);
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
    }

    #[tokio::test]
    async fn sessions_of_one_tenant_are_isolated() {
        let fx = Fixture::new(1024);
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
                matches!(result, Err(ToolError::Denied(_))),
                "{tenant}/{session}"
            );
        }
    }
}
