//! `grep_files`: lines of the session's files that match a regular expression or a literal text.
//!
//! Invariants:
//! - the pattern is compiled with bounded size (`regex` runs in time linear in the input, so no
//!   pattern can make a search explode);
//! - only the session's files are read (optionally narrowed to a file or directory and a glob);
//!   files that are not UTF-8 text are skipped and counted;
//! - output is bounded: at most `max_results` lines (ceiling [`MAX_GREP_RESULTS`]), each cut to
//!   [`MAX_LINE_CHARS`] characters, with a note when the search stopped early.

use std::sync::Arc;

use futures::StreamExt;
use schemars::JsonSchema;
use serde::Deserialize;
use skein_common::protocol::ToolEffects;
use skein_common::workspace::WorkspacePath;

use super::{Tool, ToolContext, ToolError};
use crate::workspace::WorkspaceStore;

/// Matching lines one call returns unless asked for fewer.
pub const DEFAULT_GREP_RESULTS: usize = 100;

/// Most matching lines one call returns.
pub const MAX_GREP_RESULTS: usize = 500;

/// Longest part of a matching line shown.
pub const MAX_LINE_CHARS: usize = 300;

/// Largest compiled pattern.
const MAX_PATTERN_SIZE: usize = 1 << 20;

/// Files read at once.
const PARALLEL_READS: usize = 4;

/// Searches file contents.
#[derive(Debug, Clone)]
pub struct GrepFiles {
    store: Arc<dyn WorkspaceStore>,
}

impl GrepFiles {
    pub fn new(store: Arc<dyn WorkspaceStore>) -> Self {
        Self { store }
    }
}

/// Arguments of `grep_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepFilesArgs {
    /// Regular expression (Rust `regex` syntax) to look for in each line; with `literal`, plain
    /// text.
    pub pattern: String,
    /// Treat `pattern` as plain text, not a regular expression (default false).
    #[serde(default)]
    pub literal: Option<bool>,
    /// Match letters regardless of case (default false).
    #[serde(default)]
    pub ignore_case: Option<bool>,
    /// File or directory to search, relative to the workspace (default ".", everything).
    #[serde(default)]
    pub path: Option<String>,
    /// Only files whose workspace path matches this glob (e.g. `**/*.md`).
    #[serde(default)]
    pub glob: Option<String>,
    /// Most matching lines to return (default 100, at most 500).
    #[serde(default)]
    pub max_results: Option<u32>,
}

impl Tool for GrepFiles {
    const NAME: &'static str = "grep_files";
    type Args = GrepFilesArgs;

    fn effects(&self) -> ToolEffects {
        ToolEffects::READ_ONLY
    }

    fn description(&self) -> String {
        format!(
            "Search the text files of the session workspace for a regular expression (or plain \
             text with `literal`): one `path:line:text` per matching line, at most \
             {MAX_GREP_RESULTS}. Narrow it with `path` (a file or directory) and `glob`."
        )
    }

    async fn call(&self, args: GrepFilesArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        let source = if args.literal.unwrap_or(false) {
            regex::escape(&args.pattern)
        } else {
            args.pattern.clone()
        };
        if source.is_empty() {
            return Err(ToolError::InvalidArguments(
                "empty pattern: give the text or expression to look for".into(),
            ));
        }
        let pattern = regex::RegexBuilder::new(&source)
            .case_insensitive(args.ignore_case.unwrap_or(false))
            .size_limit(MAX_PATTERN_SIZE)
            .dfa_size_limit(MAX_PATTERN_SIZE)
            .build()
            .map_err(|e| ToolError::InvalidArguments(format!("invalid pattern: {e}")))?;
        let filter = args.glob.as_deref().map(super::glob::matcher).transpose()?;
        let scope = WorkspacePath::parse(args.path.as_deref().unwrap_or("."))?;
        let limit = args
            .max_results
            .map_or(DEFAULT_GREP_RESULTS, |m| m as usize)
            .clamp(1, MAX_GREP_RESULTS);

        let files = self.store.files(ctx.origin).await?;
        let selected: Vec<String> = files
            .into_iter()
            .map(|f| f.path)
            .filter(|p| p == scope.as_str() || scope.contains(p))
            .filter(|p| filter.as_ref().is_none_or(|g| g.is_match(p)))
            .collect();
        if selected.is_empty() && !scope.is_root() && args.glob.is_none() {
            return Err(ToolError::NotFound(format!(
                "{scope}: no such file or directory"
            )));
        }

        let store = &self.store;
        let origin = ctx.origin;
        let mut reads = futures::stream::iter(selected)
            .map(|path| async move {
                let parsed = WorkspacePath::parse(&path)?;
                let content = store.read(origin, &parsed).await?;
                Ok::<_, ToolError>((path, content.bytes))
            })
            .buffered(PARALLEL_READS);
        let mut lines = Vec::new();
        let (mut skipped, mut stopped) = (0, false);
        'files: while let Some(read) = reads.next().await {
            let (path, bytes) = match read {
                Ok(read) => read,
                // Removed since the listing.
                Err(ToolError::NotFound(_)) => continue,
                Err(other) => return Err(other),
            };
            let Some(text) = std::str::from_utf8(&bytes)
                .ok()
                .filter(|t| !t.contains('\0'))
            else {
                skipped += 1;
                continue;
            };
            for (number, line) in text.lines().enumerate() {
                if !pattern.is_match(line) {
                    continue;
                }
                if lines.len() == limit {
                    stopped = true;
                    break 'files;
                }
                lines.push(format!("{path}:{}:{}", number + 1, shorten(line)));
            }
        }
        let mut output = if lines.is_empty() {
            format!("no matches for {}", args.pattern)
        } else {
            lines.join("\n")
        };
        if stopped {
            output.push_str(&format!(
                "\n[stopped at {limit} matching lines; narrow the pattern, path or glob]"
            ));
        }
        if skipped > 0 {
            output.push_str(&format!("\n[{skipped} files not searched: not UTF-8 text]"));
        }
        Ok(output)
    }
}

/// `line` cut to [`MAX_LINE_CHARS`] characters, marked when cut.
fn shorten(line: &str) -> String {
    match line.char_indices().nth(MAX_LINE_CHARS) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use crate::tools::fs::test_support::Fixture;
    use crate::tools::ToolError;
    use serde_json::json;
    use skein_common::workspace::Limits;

    async fn seeded() -> Fixture {
        let fx = Fixture::new(1024, Limits::default());
        for (path, content) in [
            ("a.md", "alpha\nBeta gamma\nbeta.*\n"),
            ("notes/b.md", "nothing here\nbeta again\n"),
            ("notes/c.txt", "beta in text\n"),
        ] {
            fx.call("write_file", json!({"path": path, "content": content}))
                .await
                .expect("written");
        }
        fx
    }

    #[tokio::test]
    async fn lines_match_by_regex_or_literal() {
        let fx = seeded().await;
        let grep = |args: serde_json::Value| fx.call("grep_files", args);
        assert_eq!(
            grep(json!({"pattern": "^beta"})).await,
            Ok("a.md:3:beta.*\nnotes/b.md:2:beta again\nnotes/c.txt:1:beta in text".into())
        );
        assert_eq!(
            grep(json!({"pattern": "beta.*", "literal": true})).await,
            Ok("a.md:3:beta.*".into())
        );
        assert_eq!(
            grep(json!({"pattern": "^beta", "ignore_case": true, "path": "a.md"})).await,
            Ok("a.md:2:Beta gamma\na.md:3:beta.*".into())
        );
        assert_eq!(
            grep(json!({"pattern": "beta", "path": "notes", "glob": "**/*.md"})).await,
            Ok("notes/b.md:2:beta again".into())
        );
        assert_eq!(
            grep(json!({"pattern": "zeta"})).await,
            Ok("no matches for zeta".into())
        );
        assert_eq!(
            grep(json!({"pattern": "beta", "max_results": 1})).await,
            Ok(
                "a.md:3:beta.*\n[stopped at 1 matching lines; narrow the pattern, path or glob]"
                    .into()
            )
        );
    }

    #[tokio::test]
    async fn bad_requests_are_refused_clearly() {
        let fx = seeded().await;
        let grep = |args: serde_json::Value| fx.call("grep_files", args);
        let invalid = grep(json!({"pattern": "("})).await;
        assert!(
            matches!(&invalid, Err(ToolError::InvalidArguments(m)) if m.contains("invalid pattern")),
            "{invalid:?}"
        );
        let missing = grep(json!({"pattern": "a", "path": "nowhere"})).await;
        assert!(
            matches!(missing, Err(ToolError::NotFound(_))),
            "{missing:?}"
        );
        let escape = grep(json!({"pattern": "a", "path": "../s2"})).await;
        assert!(matches!(escape, Err(ToolError::Denied(_))), "{escape:?}");
        let empty = grep(json!({"pattern": ""})).await;
        assert!(
            matches!(empty, Err(ToolError::InvalidArguments(_))),
            "{empty:?}"
        );
    }

    #[test]
    fn long_lines_are_cut_at_a_char_boundary() {
        let line = "é".repeat(super::MAX_LINE_CHARS + 5);
        let cut = super::shorten(&line);
        assert_eq!(cut.chars().count(), super::MAX_LINE_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(super::shorten("short"), "short");
    }
}
