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
    escape_glob(tool)
}

/// The rule text that allows the later calls of `tool` whose primary argument (see
/// [`primary_argument`]) is the same as this call's, and no others: `tool(argument)` with the glob
/// metacharacters of both parts escaped. An argument of only spaces keeps them, each in a class
/// (`[ ]`), since a blank pattern does not parse; an empty one becomes `{}`, the empty
/// alternation, which matches only the empty text.
pub fn always_rule_for_call(tool: &str, arguments: &Value) -> String {
    let argument = primary_argument(arguments);
    let pattern = if argument.is_empty() {
        "{}".to_owned()
    } else if argument.trim().is_empty() {
        argument.chars().map(|c| format!("[{c}]")).collect()
    } else {
        escape_glob(&argument)
    };
    format!("{}({pattern})", escape_glob(tool))
}

/// Checks a rule a person gave with their "always approve" in place of
/// [`always_rule_for_call`]'s: it must parse and must match the call it approves. Returns the
/// rule text to keep (trimmed), or why it is refused.
pub fn check_always_rule(text: &str, tool: &str, arguments: &Value) -> Result<String, String> {
    let rule = Rule::parse(text).map_err(|e| format!("the always rule does not parse: {e}"))?;
    if !rule.matches(tool, arguments) {
        return Err(format!(
            "the always rule {:?} does not match the call it approves ({tool} with {:?})",
            text.trim(),
            crate::text::cut(&primary_argument(arguments), 200)
        ));
    }
    Ok(text.trim().to_owned())
}

/// `text` as a glob that matches only itself: `? * [ ] { } ( )` each in a class of its own
/// (`[*]`), a backslash doubled.
fn escape_glob(text: &str) -> String {
    let mut glob = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '?' | '*' | '[' | ']' | '{' | '}' | '(' | ')' => {
                glob.push('[');
                glob.push(c);
                glob.push(']');
            }
            '\\' => glob.push_str("\\\\"),
            c => glob.push(c),
        }
    }
    glob
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

    #[test]
    fn always_rules_for_a_call_match_only_calls_with_its_primary_argument() {
        let calls = [
            ("shell", "command", "rm -rf build/*", "rm -rf build/out"),
            ("shell", "command", "echo (a) b) (c", "echo (a) b) (x"),
            ("write_file", "path", "notes/my file.md", "notes/my_file.md"),
            ("read_file", "path", "a/[b]/{c,d}?.md", "a/b/c.md"),
            ("shell", "command", "dir C:\\tmp\\*", "dir C:\\tmp\\x"),
            (
                "odd*name",
                "url",
                "https://x.test/(v1)/*",
                "https://x.test/(v1)/y",
            ),
            ("with(paren)", "path", "p(1)", "p(2)"),
        ];
        for (tool, key, argument, neighbour) in calls {
            let arguments = json!({ key: argument });
            let text = always_rule_for_call(tool, &arguments);
            let compiled = Rule::parse(&text).expect("an always rule for a call parses");
            assert!(
                compiled.matches(tool, &arguments),
                "{text} matches its call"
            );
            assert!(
                !compiled.matches(tool, &json!({ key: neighbour })),
                "{text} does not match {neighbour:?}"
            );
            assert!(!compiled.matches("other_tool", &arguments), "{text}");
        }
        assert_eq!(
            always_rule_for_call("shell", &json!({"command": "ls (a)*"})),
            "shell(ls [(]a[)][*])"
        );
    }

    #[test]
    fn always_rules_for_a_call_without_a_primary_key_match_its_compact_json() {
        let arguments = json!({"query": "a*(b)", "limit": 3, "tags": ["x/y", "{z}"]});
        let text = always_rule_for_call("search", &arguments);
        let compiled = Rule::parse(&text).expect("the rule for JSON arguments parses");
        assert!(compiled.matches("search", &arguments), "{text}");
        let other = json!({"query": "a*(b)", "limit": 4, "tags": ["x/y", "{z}"]});
        assert!(!compiled.matches("search", &other), "{text}");
        let wider = json!({"query": "a*(b)", "limit": 3, "tags": ["x/y", "{z}"], "more": 1});
        assert!(!compiled.matches("search", &wider), "{text}");
    }

    #[test]
    fn always_rules_for_a_blank_or_empty_argument_match_only_that_argument() {
        for blank in ["", " ", "  \t"] {
            let arguments = json!({ "command": blank });
            let text = always_rule_for_call("shell", &arguments);
            let compiled = Rule::parse(&text).expect("a rule for a blank argument parses");
            assert!(compiled.matches("shell", &arguments), "{text:?}");
            for other in ["", " ", "x", "  \t "] {
                let expected = other == blank;
                let call = json!({ "command": other });
                assert_eq!(
                    compiled.matches("shell", &call),
                    expected,
                    "{text:?} on {other:?}"
                );
            }
        }
    }

    #[test]
    fn a_persons_own_always_rule_must_parse_and_match_the_call_it_approves() {
        let call = json!({"command": "git push origin main"});
        assert_eq!(
            check_always_rule(" shell(git *) ", "shell", &call),
            Ok("shell(git *)".to_owned())
        );
        assert_eq!(
            check_always_rule("shell", "shell", &call),
            Ok("shell".to_owned())
        );
        let narrow = check_always_rule("shell(git status*)", "shell", &call)
            .expect_err("a rule that misses the call");
        assert!(narrow.contains("does not match"), "{narrow}");
        assert!(narrow.contains("git push origin main"), "{narrow}");
        let other_tool =
            check_always_rule("read_file", "shell", &call).expect_err("a rule for another tool");
        assert!(other_tool.contains("does not match"), "{other_tool}");
        let broken = check_always_rule("shell(git *", "shell", &call)
            .expect_err("a rule that does not parse");
        assert!(broken.contains("does not parse"), "{broken}");
        assert!(broken.contains("missing the closing ')'"), "{broken}");
    }
}
