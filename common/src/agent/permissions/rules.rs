//! Permission rules: parsing a rule string into a compiled [`Rule`] and matching it against a call.
//!
//! A rule is `tool` or `tool(argument pattern)`:
//! - the tool part is a glob over the tool name (`read_file`, `mcp__github__*`, `*`);
//! - the pattern part is a glob over the call's *primary argument* (see [`primary_argument`]);
//!   a rule without one matches every call of its tools.
//!
//! Glob syntax is the same for both parts and for every kind of argument: `*` and `?` never cross
//! a `/`, `**` as a whole segment crosses any number of them, `[abc]` and `{a,b}` work as usual and
//! `\` escapes the next character. So `write_file(notes/*)` allows `notes/a.md` but not
//! `notes/a/b.md`, `write_file(notes/**)` allows both, and a whole web host is
//! `http_fetch(https://api.example.com/**)`.
//!
//! Invariants: a [`Rule`] only exists once its text parsed and both globs compiled, so matching
//! never fails; a parse error names the rule text it refused.

use std::borrow::Cow;
use std::fmt;

use globset::{GlobBuilder, GlobMatcher};
use serde_json::Value;

/// Argument keys that hold a call's primary argument, in the order they are looked up.
pub const PRIMARY_ARGUMENT_KEYS: [&str; 6] = ["path", "url", "command", "pattern", "agent", "name"];

/// Why a rule string could not be compiled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PermissionError {
    /// The rule's shape is wrong (empty tool, unbalanced parentheses, empty pattern).
    #[error("rule {rule:?}: {reason}")]
    Malformed { rule: String, reason: &'static str },
    /// One of its globs does not compile.
    #[error("rule {rule:?}: invalid glob: {}", .source.kind())]
    InvalidGlob {
        rule: String,
        #[source]
        source: globset::Error,
    },
}

/// A compiled permission rule: `tool` or `tool(argument pattern)`, both parts globs in which `*`
/// and `?` never cross a `/` and a whole-segment `**` crosses any number of them
/// (`write_file(notes/**)`, `http_fetch(https://api.example.com/**)`, `mcp__github__*`).
#[derive(Debug, Clone)]
pub struct Rule {
    text: String,
    tool: GlobMatcher,
    argument: Option<GlobMatcher>,
}

impl Rule {
    /// Parses and compiles `tool` or `tool(argument pattern)`.
    pub fn parse(text: &str) -> Result<Self, PermissionError> {
        let malformed = |reason| PermissionError::Malformed {
            rule: text.to_owned(),
            reason,
        };
        let trimmed = text.trim();
        let (tool, argument) = match open_paren(trimmed) {
            Some(open) => {
                let Some(pattern) = trimmed[open + 1..].strip_suffix(')') else {
                    return Err(malformed("unbalanced parentheses: missing the closing ')'"));
                };
                if pattern.trim().is_empty() {
                    return Err(malformed("empty argument pattern inside '()'"));
                }
                (trimmed[..open].trim_end(), Some(pattern))
            }
            None if has_bare_close_paren(trimmed) => {
                return Err(malformed("unbalanced parentheses: ')' without '('"));
            }
            None => (trimmed, None),
        };
        if tool.is_empty() {
            return Err(malformed("empty tool name"));
        }
        let compile = |glob: &str| {
            GlobBuilder::new(glob)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map(|g| g.compile_matcher())
                .map_err(|source| PermissionError::InvalidGlob {
                    rule: text.to_owned(),
                    source,
                })
        };
        Ok(Self {
            text: text.to_owned(),
            tool: compile(tool)?,
            argument: argument.map(compile).transpose()?,
        })
    }

    /// The rule as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the rule speaks about this call.
    pub fn matches(&self, tool: &str, arguments: &Value) -> bool {
        self.tool.is_match(tool)
            && self
                .argument
                .as_ref()
                .is_none_or(|pattern| pattern.is_match(primary_argument(arguments).as_ref()))
    }
}

impl std::str::FromStr for Rule {
    type Err = PermissionError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Compiles a list of rule strings; the first bad one is the error.
pub fn compile_all(texts: &[String]) -> Result<Vec<Rule>, PermissionError> {
    texts.iter().map(|t| Rule::parse(t)).collect()
}

/// The first rule of `rules` that matches the call.
pub fn matches_any<'r>(rules: &'r [Rule], tool: &str, arguments: &Value) -> Option<&'r Rule> {
    rules.iter().find(|rule| rule.matches(tool, arguments))
}

/// The text an argument pattern is matched against: the first string among the argument keys
/// [`PRIMARY_ARGUMENT_KEYS`], or else the compact JSON of all arguments.
pub fn primary_argument(arguments: &Value) -> Cow<'_, str> {
    PRIMARY_ARGUMENT_KEYS
        .iter()
        .find_map(|key| arguments.get(key).and_then(Value::as_str))
        .map(Cow::Borrowed)
        .unwrap_or_else(|| Cow::Owned(arguments.to_string()))
}

/// The rule text that allows every call of `tool` (what a person's "always approve" adds): the
/// name with its glob metacharacters escaped.
pub fn always_rule(tool: &str) -> String {
    let mut rule = String::with_capacity(tool.len());
    for c in tool.chars() {
        match c {
            '?' | '*' | '[' | ']' | '{' | '}' | '(' | ')' => {
                rule.push('[');
                rule.push(c);
                rule.push(']');
            }
            '\\' => rule.push_str("\\\\"),
            c => rule.push(c),
        }
    }
    rule
}

/// Byte offset of the `(` that opens the argument pattern; a `[(]` (an escaped parenthesis in the
/// tool glob) is not one.
fn open_paren(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    (0..bytes.len()).find(|&i| bytes[i] == b'(' && !is_bracketed(bytes, i))
}

fn has_bare_close_paren(text: &str) -> bool {
    let bytes = text.as_bytes();
    (0..bytes.len()).any(|i| bytes[i] == b')' && !is_bracketed(bytes, i))
}

/// Whether the byte at `i` is the sole member of a character class (`[(]`, `[)]`).
fn is_bracketed(bytes: &[u8], i: usize) -> bool {
    i > 0 && bytes[i - 1] == b'[' && bytes.get(i + 1) == Some(&b']')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(text: &str) -> Rule {
        Rule::parse(text).expect("rule parses")
    }

    #[test]
    fn globs_match_by_segment() {
        let notes = rule("write_file(notes/**)");
        assert!(notes.matches("write_file", &json!({"path": "notes/a/b.md"})));
        assert!(notes.matches("write_file", &json!({"path": "notes/a.md"})));
        assert!(!notes.matches("write_file", &json!({"path": "other/x"})));
        assert!(!notes.matches("read_file", &json!({"path": "notes/a.md"})));
        let one_level = rule("write_file(notes/*)");
        assert!(one_level.matches("write_file", &json!({"path": "notes/a.md"})));
        assert!(!one_level.matches("write_file", &json!({"path": "notes/a/b.md"})));
        let github = rule("mcp__github__*");
        assert!(github.matches("mcp__github__create_issue", &json!({})));
        assert!(!github.matches("mcp__gitlab__create_issue", &json!({})));
        assert!(rule("*").matches("anything", &json!(null)));
    }

    #[test]
    fn urls_follow_the_same_segment_rule() {
        let host = rule("http_fetch(https://api.example.com/**)");
        let fetch = |url: &str| json!({ "url": url });
        assert!(host.matches("http_fetch", &fetch("https://api.example.com/v1/x")));
        assert!(!host.matches("http_fetch", &fetch("https://evil.example.com/v1/x")));
        let shallow = rule("http_fetch(https://api.example.com/*)");
        assert!(shallow.matches("http_fetch", &fetch("https://api.example.com/v1")));
        assert!(!shallow.matches("http_fetch", &fetch("https://api.example.com/v1/x")));
    }

    #[test]
    fn primary_argument_takes_the_first_string_key() {
        assert_eq!(primary_argument(&json!({"name": "n", "path": "p"})), "p");
        assert_eq!(primary_argument(&json!({"path": 3, "url": "u"})), "u");
        assert_eq!(
            primary_argument(&json!({"command": "ls -la", "agent": "a"})),
            "ls -la"
        );
        assert_eq!(primary_argument(&json!({"x": 1})), r#"{"x":1}"#);
        let shell = rule("shell(git status*)");
        assert!(shell.matches("shell", &json!({"command": "git status --short"})));
        assert!(!shell.matches("shell", &json!({"command": "git push"})));
    }

    #[test]
    fn bad_rules_name_themselves() {
        for (text, needle) in [
            ("write_file(notes/**", "missing the closing ')'"),
            ("write_file)", "')' without '('"),
            ("", "empty tool name"),
            ("(notes/**)", "empty tool name"),
            ("write_file()", "empty argument pattern"),
            ("write_file(notes/[a)", "invalid glob"),
            ("wri{te", "invalid glob"),
        ] {
            let err = Rule::parse(text).expect_err(text);
            let message = err.to_string();
            assert!(message.contains(&format!("{text:?}")), "{message}");
            assert!(message.contains(needle), "{message}");
        }
    }

    #[test]
    fn always_rules_match_exactly_their_tool() {
        for tool in [
            "read_file",
            "odd*name",
            "with(paren)",
            "br[ack]et",
            "back\\slash",
        ] {
            let text = always_rule(tool);
            let compiled = Rule::parse(&text).expect("an always rule parses");
            assert!(compiled.matches(tool, &json!({"path": "x"})), "{text}");
        }
        assert!(!rule(&always_rule("odd*name")).matches("odd_other_name", &json!({})));
    }
}
