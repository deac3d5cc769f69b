//! `glob_files`: the session's files whose paths match a glob pattern.
//!
//! Invariants: the pattern is matched against normal workspace paths (`notes/a.md`), relative to
//! the workspace; `*` and `?` stay within one path segment and `**` crosses any number of them; at
//! most [`MAX_GLOB_RESULTS`] paths are returned, with a note saying how many more matched.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use skein_common::protocol::ToolEffects;

use super::{Tool, ToolContext, ToolError};
use crate::workspace::WorkspaceStore;

/// Most paths one call returns.
pub const MAX_GLOB_RESULTS: usize = 500;

/// Finds files by glob pattern.
#[derive(Debug, Clone)]
pub struct GlobFiles {
    store: Arc<dyn WorkspaceStore>,
}

impl GlobFiles {
    pub fn new(store: Arc<dyn WorkspaceStore>) -> Self {
        Self { store }
    }
}

/// Arguments of `glob_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobFilesArgs {
    /// Glob pattern relative to the workspace, e.g. `**/*.md` or `src/*.rs`: `*` and `?` match
    /// within one directory level, `**` across levels, `{a,b}` either.
    pub pattern: String,
}

impl Tool for GlobFiles {
    const NAME: &'static str = "glob_files";
    type Args = GlobFilesArgs;

    fn effects(&self) -> ToolEffects {
        ToolEffects::READ_ONLY
    }

    fn description(&self) -> String {
        format!(
            "Find files of the session workspace by glob pattern (e.g. `**/*.md`): one path per \
             line, sorted; at most {MAX_GLOB_RESULTS}."
        )
    }

    async fn call(&self, args: GlobFilesArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        let matcher = matcher(&args.pattern)?;
        let files = self.store.files(ctx.origin).await?;
        let matched: Vec<&str> = files
            .iter()
            .map(|f| f.path.as_str())
            .filter(|p| matcher.is_match(p))
            .collect();
        if matched.is_empty() {
            return Ok(format!("no files match {}", args.pattern));
        }
        let mut text = matched
            .iter()
            .take(MAX_GLOB_RESULTS)
            .copied()
            .collect::<Vec<_>>()
            .join("\n");
        if matched.len() > MAX_GLOB_RESULTS {
            text.push_str(&format!(
                "\n[{} more files match; narrow the pattern]",
                matched.len() - MAX_GLOB_RESULTS
            ));
        }
        Ok(text)
    }
}

/// A matcher for a workspace-relative glob `pattern` (a leading `./` is allowed).
pub(crate) fn matcher(pattern: &str) -> Result<globset::GlobMatcher, ToolError> {
    let trimmed = pattern.trim_start_matches("./");
    if trimmed.is_empty() {
        return Err(ToolError::InvalidArguments(
            "empty pattern: give a glob such as **/*.md".into(),
        ));
    }
    if trimmed.starts_with('/') {
        return Err(ToolError::InvalidArguments(format!(
            "pattern {pattern:?} is absolute: patterns are relative to the workspace"
        )));
    }
    globset::GlobBuilder::new(trimmed)
        .literal_separator(true)
        .build()
        .map(|glob| glob.compile_matcher())
        .map_err(|e| ToolError::InvalidArguments(format!("invalid glob pattern {pattern:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use crate::tools::fs::test_support::Fixture;
    use crate::tools::ToolError;
    use serde_json::json;
    use skein_common::workspace::Limits;

    #[tokio::test]
    async fn patterns_match_workspace_paths() {
        let fx = Fixture::new(1024, Limits::default());
        for path in ["a.md", "b.txt", "notes/c.md", "notes/deep/d.md"] {
            fx.call("write_file", json!({"path": path, "content": "x"}))
                .await
                .expect("written");
        }
        let glob = |pattern: &str| fx.call("glob_files", json!({ "pattern": pattern }));
        assert_eq!(glob("*.md").await, Ok("a.md".into()));
        assert_eq!(
            glob("**/*.md").await,
            Ok("a.md\nnotes/c.md\nnotes/deep/d.md".into())
        );
        assert_eq!(glob("./notes/*").await, Ok("notes/c.md".into()));
        assert_eq!(glob("{a,b}.*").await, Ok("a.md\nb.txt".into()));
        assert_eq!(glob("*.rs").await, Ok("no files match *.rs".into()));
        for bad in ["/etc/*", "", "a[", "../*"] {
            let result = glob(bad).await;
            if bad == "../*" {
                // Nothing lies above the workspace: a valid pattern that matches nothing.
                assert_eq!(result, Ok("no files match ../*".into()));
            } else {
                assert!(
                    matches!(result, Err(ToolError::InvalidArguments(_))),
                    "{bad:?}: {result:?}"
                );
            }
        }
    }
}
