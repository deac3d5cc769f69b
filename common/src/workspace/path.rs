//! Workspace paths: the one place that decides which path texts name a file of a session's
//! workspace, and what their normal form is.
//!
//! Invariants:
//! - a [`WorkspacePath`] is relative, made of normal segments joined by `/`, with no `.`, `..`,
//!   empty segment, NUL or other control character; `"."` (the workspace itself) is the empty path;
//! - two texts that name the same file ("a//b", "./a/b") have the same normal form, so an object
//!   name or a directory entry never exists twice under two spellings;
//! - lengths are bounded ([`MAX_PATH_BYTES`], [`MAX_SEGMENT_BYTES`]) so every path fits in a NATS
//!   subject and in a file name on disk;
//! - every refusal is a [`WorkspaceError::Denied`] that names the path as given.

use std::path::{Component, Path};

use super::WorkspaceError;

/// Longest normalized path, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;

/// Longest segment of a path (a file or directory name), in bytes: what file systems allow.
pub const MAX_SEGMENT_BYTES: usize = 255;

/// A normalized path relative to a session's workspace. See the module invariants.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkspacePath(String);

impl WorkspacePath {
    /// Checks and normalizes `relative` (see the module invariants).
    pub fn parse(relative: &str) -> Result<Self, WorkspaceError> {
        clean_relative(relative).map(Self)
    }

    /// The normal form: segments joined by `/`; empty for the workspace itself.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is the workspace itself (`"."`).
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The path's segments, outermost first.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|s| !s.is_empty())
    }

    /// Whether `file` (a normal form) lies below this directory path.
    pub fn contains(&self, file: &str) -> bool {
        self.is_root()
            || file
                .strip_prefix(self.0.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
    }
}

impl std::fmt::Display for WorkspacePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            f.write_str(".")
        } else {
            f.write_str(&self.0)
        }
    }
}

/// The normal form of `relative`: its normal segments joined by `/`; empty for `"."`.
pub fn clean_relative(relative: &str) -> Result<String, WorkspaceError> {
    if relative.is_empty() {
        return Err(WorkspaceError::Denied(
            "empty path: give a path relative to the workspace".to_owned(),
        ));
    }
    if relative.contains('\0') {
        return Err(escapes(relative, "it contains a NUL byte"));
    }
    if relative.chars().any(char::is_control) {
        return Err(WorkspaceError::Denied(format!(
            "invalid path {relative:?}: control characters are not allowed in names"
        )));
    }
    let mut cleaned = String::with_capacity(relative.len());
    for component in Path::new(relative).components() {
        match component {
            Component::Normal(part) => {
                let part = part.to_str().ok_or_else(|| {
                    WorkspaceError::Denied(format!("invalid path {relative:?}: not UTF-8"))
                })?;
                if part.len() > MAX_SEGMENT_BYTES {
                    return Err(WorkspaceError::Denied(format!(
                        "invalid path {relative:?}: a name may have at most {MAX_SEGMENT_BYTES} bytes"
                    )));
                }
                if !cleaned.is_empty() {
                    cleaned.push('/');
                }
                cleaned.push_str(part);
            }
            Component::CurDir => {}
            Component::ParentDir => return Err(escapes(relative, "`..` is not allowed")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(escapes(relative, "absolute paths are not allowed"))
            }
        }
    }
    if cleaned.len() > MAX_PATH_BYTES {
        return Err(WorkspaceError::Denied(format!(
            "invalid path: {} bytes long; a path may have at most {MAX_PATH_BYTES}",
            cleaned.len()
        )));
    }
    Ok(cleaned)
}

fn escapes(relative: &str, why: &str) -> WorkspaceError {
    WorkspaceError::Denied(format!(
        "path escapes the workspace: {relative:?} ({why}); use a path relative to the workspace"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn paths_are_normalized() {
        for (given, normal) in [
            (".", ""),
            ("./", ""),
            ("a", "a"),
            ("./a//b/", "a/b"),
            ("a/./b", "a/b"),
            ("notes/a.txt", "notes/a.txt"),
            (".hidden", ".hidden"),
            ("a..b/c", "a..b/c"),
            ("with space/é.md", "with space/é.md"),
        ] {
            assert_eq!(
                clean_relative(given).ok().as_deref(),
                Some(normal),
                "{given:?}"
            );
        }
    }

    #[test]
    fn escapes_and_bad_names_are_denied_naming_the_path() {
        for (given, why) in [
            ("../x", "`..` is not allowed"),
            ("a/../../x", "`..` is not allowed"),
            ("a/..", "`..` is not allowed"),
            ("/etc/passwd", "absolute paths"),
            ("x\0y", "NUL"),
            ("a\nb", "control characters"),
            ("", "empty path"),
        ] {
            match clean_relative(given) {
                Err(WorkspaceError::Denied(message)) => {
                    assert!(message.contains(why), "{given:?}: {message}")
                }
                other => panic!("{given:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn lengths_are_bounded() {
        let long_name = "n".repeat(MAX_SEGMENT_BYTES + 1);
        assert!(clean_relative(&long_name).is_err());
        assert!(clean_relative(&"n".repeat(MAX_SEGMENT_BYTES)).is_ok());
        let deep = vec!["d".repeat(100); 11].join("/");
        assert!(deep.len() > MAX_PATH_BYTES);
        assert!(clean_relative(&deep).is_err());
    }

    #[test]
    fn directories_contain_what_lies_below_them() {
        let dir = WorkspacePath::parse("notes").expect("valid");
        assert!(dir.contains("notes/a.txt"));
        assert!(!dir.contains("notes"));
        assert!(!dir.contains("notes2/a.txt"));
        let root = WorkspacePath::parse(".").expect("valid");
        assert!(root.is_root() && root.contains("anything"));
        assert_eq!(root.to_string(), ".");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any text: refused, or a normal form that is its own normal form and never climbs out.
        #[test]
        fn normal_forms_are_stable_and_stay_inside(
            relative in prop_oneof![
                ".{0,40}",
                "(\\.\\.?/|/|[a-z]{1,3}/|\\\\|%2e|\u{0}){0,6}[a-z.]{0,8}",
            ]
        ) {
            if let Ok(normal) = clean_relative(&relative) {
                prop_assert!(!normal.starts_with('/'));
                prop_assert!(normal.split('/').all(|s| s != ".." && s != "."));
                if !normal.is_empty() {
                    let again = clean_relative(&normal).ok();
                    prop_assert_eq!(again.as_deref(), Some(normal.as_str()));
                }
            }
        }
    }
}
