//! Tools' own permission checks: what a tool says about one of its calls before any `allow` rule
//! or the mode is asked.
//!
//! Invariants: a check is a pure function of the call; it speaks only where it knows better than a
//! rule (a path that leaves the workspace is never allowed, the runtime's own tools are always
//! allowed), and stays silent otherwise. `deny` and `ask` rules still come before it.

use serde_json::Value;

use super::Decision;

/// The tools that read or write files of the session's workspace by a `path` argument.
pub const WORKSPACE_FILE_TOOLS: [&str; 6] = [
    "read_file",
    "write_file",
    "edit_file",
    "list_files",
    "glob_files",
    "grep_files",
];

/// Tools the agent runtime answers itself (loading a skill, spawning a subagent); what they may
/// reach is already limited by the agent's definition (`skills`, `subagents`).
pub const RUNTIME_TOOLS: [&str; 2] = ["load_skill", "spawn_agent"];

/// The tool's own verdict on a call, if it has one.
pub fn tool_check(tool: &str, arguments: &Value) -> Option<Decision> {
    if RUNTIME_TOOLS.contains(&tool) {
        return Some(Decision::Allow {
            reason: "tool check: runtime tool".into(),
        });
    }
    if WORKSPACE_FILE_TOOLS.contains(&tool) {
        let path = arguments.get("path").and_then(Value::as_str)?;
        if escapes_workspace(path) {
            return Some(Decision::Deny {
                reason: "tool check: path escapes the workspace".into(),
            });
        }
    }
    None
}

/// Whether a workspace-relative path is absolute or climbs out with a `..` segment (either
/// separator and a drive prefix count, so a Windows-style path cannot slip through).
fn escapes_workspace(path: &str) -> bool {
    let absolute = path.starts_with(['/', '\\'])
        || matches!(path.as_bytes(), [drive, b':', ..] if drive.is_ascii_alphabetic())
        || std::path::Path::new(path).is_absolute();
    absolute || path.split(['/', '\\']).any(|segment| segment == "..")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_that_leave_the_workspace_are_denied() {
        for path in [
            "/etc/passwd",
            "../x",
            "notes/../../x",
            "a\\..\\b",
            "C:\\x",
            "\\\\host",
        ] {
            assert!(
                matches!(
                    tool_check("read_file", &json!({ "path": path })),
                    Some(Decision::Deny { .. })
                ),
                "{path}"
            );
        }
        for path in ["notes/a.md", "a..b/c", ".", "..."] {
            assert_eq!(
                tool_check("write_file", &json!({ "path": path })),
                None,
                "{path}"
            );
        }
        assert_eq!(tool_check("shell", &json!({ "path": "/etc" })), None);
        assert_eq!(tool_check("list_files", &json!({})), None);
    }

    #[test]
    fn runtime_tools_are_allowed() {
        for tool in RUNTIME_TOOLS {
            assert!(matches!(
                tool_check(tool, &json!({})),
                Some(Decision::Allow { .. })
            ));
        }
    }
}
