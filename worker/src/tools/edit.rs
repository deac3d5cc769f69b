//! `edit_file`: replaces an exact piece of text in a workspace file.
//!
//! Invariants:
//! - `old_string` must occur exactly once, unless `replace_all` is set; not found and found
//!   several times are both refused with what to do instead, and nothing is written;
//! - the edit is a conditional write of the revision that was read: if the file changes in
//!   between, the edit starts over from the new content (a few times), so no concurrent change is
//!   overwritten;
//! - only UTF-8 text is edited.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use skein_common::protocol::ToolEffects;
use skein_common::workspace::{WorkspaceError, WorkspacePath};

use super::fs::CONFLICT_RETRIES;
use super::{Tool, ToolContext, ToolError};
use crate::workspace::WorkspaceStore;

/// Replaces text in a workspace file.
#[derive(Debug, Clone)]
pub struct EditFile {
    store: Arc<dyn WorkspaceStore>,
}

impl EditFile {
    pub fn new(store: Arc<dyn WorkspaceStore>) -> Self {
        Self { store }
    }
}

/// Arguments of `edit_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditFileArgs {
    /// Path of the file, relative to the workspace.
    pub path: String,
    /// The exact text to replace, whitespace included; it must occur once unless `replace_all`.
    pub old_string: String,
    /// The text to put in its place.
    pub new_string: String,
    /// Replace every occurrence instead of exactly one (default false).
    #[serde(default)]
    pub replace_all: Option<bool>,
}

impl Tool for EditFile {
    const NAME: &'static str = "edit_file";
    type Args = EditFileArgs;

    fn description(&self) -> String {
        "Edit a text file of the session workspace: replace the exact text `old_string` with \
         `new_string`. `old_string` must occur exactly once (include surrounding lines to make it \
         unique), or set `replace_all` to replace every occurrence."
            .to_owned()
    }

    /// Two edits of one file at once would race (the second starts over, but in turn order).
    fn concurrency_safe(&self) -> bool {
        false
    }

    fn effects(&self) -> ToolEffects {
        ToolEffects::EDITS_WORKSPACE
    }

    async fn call(&self, args: EditFileArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        let path = WorkspacePath::parse(&args.path)?;
        if args.old_string.is_empty() {
            return Err(ToolError::InvalidArguments(
                "old_string is empty: give the text to replace (write_file creates or replaces \
                 a whole file)"
                    .into(),
            ));
        }
        if args.old_string == args.new_string {
            return Err(ToolError::InvalidArguments(
                "old_string and new_string are the same: nothing would change".into(),
            ));
        }
        let replace_all = args.replace_all.unwrap_or(false);
        let mut attempt = 0;
        loop {
            let current = self.store.read(ctx.origin, &path).await?;
            let text = std::str::from_utf8(&current.bytes).map_err(|_| {
                ToolError::InvalidArguments(format!(
                    "{} is not UTF-8 text; edit_file changes text files only",
                    args.path
                ))
            })?;
            let (edited, count) = replace(text, &args, replace_all)?;
            match self
                .store
                .write(ctx.origin, &path, edited.into(), Some(&current.revision))
                .await
            {
                Ok(()) => {
                    let plural = if count == 1 { "" } else { "s" };
                    return Ok(format!(
                        "replaced {count} occurrence{plural} in {}",
                        args.path
                    ));
                }
                Err(WorkspaceError::Conflict(_)) if attempt < CONFLICT_RETRIES => attempt += 1,
                Err(other) => return Err(other.into()),
            }
        }
    }
}

/// `text` with the replacement made, and how many occurrences were replaced.
fn replace(
    text: &str,
    args: &EditFileArgs,
    replace_all: bool,
) -> Result<(String, usize), ToolError> {
    let count = text.matches(args.old_string.as_str()).count();
    match count {
        0 => Err(ToolError::InvalidArguments(format!(
            "old_string was not found in {}: read the file and copy the text exactly, \
             whitespace and line breaks included",
            args.path
        ))),
        1 => Ok((text.replacen(&args.old_string, &args.new_string, 1), 1)),
        n if replace_all => Ok((text.replace(&args.old_string, &args.new_string), n)),
        n => Err(ToolError::InvalidArguments(format!(
            "old_string occurs {n} times in {}: include more surrounding text to make it \
             unique, or set replace_all to replace all {n}",
            args.path
        ))),
    }
}

#[cfg(test)]
mod tests {
    use crate::tools::fs::test_support::Fixture;
    use crate::tools::ToolError;
    use serde_json::json;
    use skein_common::workspace::Limits;

    #[tokio::test]
    async fn edits_replace_exactly_one_occurrence_or_all_when_asked() {
        let fx = Fixture::new(1024, Limits::default());
        fx.call(
            "write_file",
            json!({"path": "a.md", "content": "one two two three"}),
        )
        .await
        .expect("written");
        let once = fx
            .call(
                "edit_file",
                json!({"path": "a.md", "old_string": "one", "new_string": "1"}),
            )
            .await;
        assert_eq!(once, Ok("replaced 1 occurrence in a.md".into()));

        let ambiguous = fx
            .call(
                "edit_file",
                json!({"path": "a.md", "old_string": "two", "new_string": "2"}),
            )
            .await;
        assert!(
            matches!(&ambiguous, Err(ToolError::InvalidArguments(m)) if m.contains("occurs 2 times") && m.contains("replace_all")),
            "{ambiguous:?}"
        );
        let missing = fx
            .call(
                "edit_file",
                json!({"path": "a.md", "old_string": "four", "new_string": "4"}),
            )
            .await;
        assert!(
            matches!(&missing, Err(ToolError::InvalidArguments(m)) if m.contains("not found in a.md")),
            "{missing:?}"
        );
        assert_eq!(
            fx.call("read_file", json!({"path": "a.md"})).await,
            Ok("1 two two three".into()),
            "refused edits change nothing"
        );

        let all = fx
            .call(
                "edit_file",
                json!({"path": "a.md", "old_string": "two", "new_string": "2", "replace_all": true}),
            )
            .await;
        assert_eq!(all, Ok("replaced 2 occurrences in a.md".into()));
        assert_eq!(
            fx.call("read_file", json!({"path": "a.md"})).await,
            Ok("1 2 2 three".into())
        );
    }

    #[tokio::test]
    async fn edits_refuse_what_they_cannot_do() {
        let fx = Fixture::new(1024, Limits::default());
        let nothing = fx
            .call(
                "edit_file",
                json!({"path": "none.md", "old_string": "a", "new_string": "b"}),
            )
            .await;
        assert!(
            matches!(nothing, Err(ToolError::NotFound(_))),
            "{nothing:?}"
        );
        fx.call("write_file", json!({"path": "a.md", "content": "abc"}))
            .await
            .expect("written");
        for (args, expected) in [
            (
                json!({"path": "a.md", "old_string": "", "new_string": "x"}),
                "old_string is empty",
            ),
            (
                json!({"path": "a.md", "old_string": "a", "new_string": "a"}),
                "the same",
            ),
        ] {
            let result = fx.call("edit_file", args).await;
            assert!(
                matches!(&result, Err(ToolError::InvalidArguments(m)) if m.contains(expected)),
                "{result:?}"
            );
        }
        let escape = fx
            .call(
                "edit_file",
                json!({"path": "../x", "old_string": "a", "new_string": "b"}),
            )
            .await;
        assert!(matches!(escape, Err(ToolError::Denied(_))), "{escape:?}");
    }
}
