//! The MCP configuration: the `--mcp-config` flag and the JSON file it names, read into checked
//! [`ServerSpec`]s.
//!
//! The file has the shape other MCP clients read:
//!
//! ```json
//! {"mcpServers": {
//!   "files":  {"command": "mcp-files", "args": ["--root", "/data"], "env": {"TOKEN": "${FILES_TOKEN}"},
//!              "cwd": "/srv", "scope": "task"},
//!   "search": {"url": "https://search.example.com/mcp", "headers": {"Authorization": "Bearer ${SEARCH_KEY}"},
//!              "startup_timeout_s": 10}
//! }}
//! ```
//!
//! Invariants of a loaded configuration:
//! - every server has exactly one transport: `command` (stdio; `args`, `env`, `cwd` go with it) or
//!   `url` (streamable HTTP, `http` or `https`; `headers` go with it); an optional `type` must agree;
//! - names are 1-[`MAX_SERVER_NAME_LEN`] characters of `A-Z a-z 0-9 _ -`, so `mcp__<server>__<tool>`
//!   is a valid tool name for short tool names;
//! - an unknown field anywhere is an error, and every error names the server and the field;
//! - `${NAME}` in an `env` or `headers` value is replaced by the worker's environment variable
//!   `NAME` (an unset one is an error; `$${` stands for a literal `${`); nothing else is expanded;
//! - `env` and `headers` values are secrets: `Debug` shows their names only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::McpError;

/// Environment variable of `--mcp-config`.
pub const ENV_MCP_CONFIG: &str = "SKEIN_MCP_CONFIG";

/// Longest server name.
pub const MAX_SERVER_NAME_LEN: usize = 32;

/// How long a server may take to start and list its tools, unless it says otherwise.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest `startup_timeout_s` accepted.
const MAX_STARTUP_TIMEOUT: Duration = Duration::from_secs(600);

/// Headers the MCP transport sets itself.
const RESERVED_HEADERS: [&str; 5] = [
    "accept",
    "content-type",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

/// MCP servers whose tools this worker provides.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct McpConfig {
    /// JSON file of MCP servers whose tools this worker provides, in the usual
    /// `{"mcpServers": {...}}` form.
    #[arg(long = "mcp-config", env = ENV_MCP_CONFIG)]
    pub mcp_config: Option<PathBuf>,
}

impl McpConfig {
    /// The configured servers (none without `--mcp-config`); `${NAME}` is expanded from the
    /// process environment.
    pub fn load(&self) -> Result<Vec<ServerSpec>, McpError> {
        let Some(path) = &self.mcp_config else {
            return Ok(Vec::new());
        };
        let text = std::fs::read_to_string(path).map_err(|source| McpError::Unreadable {
            path: path.clone(),
            source,
        })?;
        parse(&text, |name| std::env::var(name).ok()).map_err(|message| McpError::Invalid {
            path: path.clone(),
            message,
        })
    }

    /// Checks the file without starting anything (for `Config::validate`).
    pub fn validate(&self) -> Result<(), String> {
        self.load().map(|_| ()).map_err(|e| e.to_string())
    }
}

/// Who owns a server's process or session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerScope {
    /// Started with the worker, shared by every task, closed when the worker stops.
    #[default]
    Worker,
    /// Started for each call inside the task's scope and closed when the task ends.
    Task,
}

/// One checked server entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSpec {
    pub name: String,
    pub transport: TransportSpec,
    pub scope: ServerScope,
    /// Bound on starting the server and listing its tools.
    pub startup_timeout: Duration,
}

/// How to reach a server.
#[derive(Clone, PartialEq)]
pub enum TransportSpec {
    /// A child process speaking MCP on stdin and stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        /// Added to the few variables a server inherits from the worker.
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// A streamable HTTP endpoint.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

impl std::fmt::Debug for TransportSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransportSpec::Stdio {
                command,
                args,
                env,
                cwd,
            } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &env.keys().collect::<Vec<_>>())
                .field("cwd", cwd)
                .finish(),
            TransportSpec::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .finish(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(rename = "mcpServers")]
    mcp_servers: BTreeMap<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    #[serde(rename = "type")]
    kind: Option<String>,
    command: Option<String>,
    args: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    cwd: Option<PathBuf>,
    url: Option<String>,
    headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    scope: ServerScope,
    startup_timeout_s: Option<f64>,
}

/// Parses and checks a configuration file's text; `env` looks up `${NAME}` references.
pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Vec<ServerSpec>, String> {
    let file: RawFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
    file.mcp_servers
        .into_iter()
        .map(|(name, raw)| {
            check_name(&name)?;
            let raw: RawServer =
                serde_json::from_value(raw).map_err(|e| format!("mcp server {name:?}: {e}"))?;
            server(name.clone(), raw, &env).map_err(|e| format!("mcp server {name:?}: {e}"))
        })
        .collect()
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_SERVER_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "mcp server name {name:?} must be 1-{MAX_SERVER_NAME_LEN} characters of A-Z a-z 0-9 _ -"
        ))
    }
}

fn server(
    name: String,
    raw: RawServer,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<ServerSpec, String> {
    let startup_timeout = match raw.startup_timeout_s {
        None => DEFAULT_STARTUP_TIMEOUT,
        Some(seconds) if seconds > 0.0 && seconds <= MAX_STARTUP_TIMEOUT.as_secs_f64() => {
            Duration::from_secs_f64(seconds)
        }
        Some(seconds) => {
            return Err(format!(
                "startup_timeout_s must be more than 0 and at most {} (got {seconds})",
                MAX_STARTUP_TIMEOUT.as_secs()
            ))
        }
    };
    let transport = match (raw.command, raw.url) {
        (Some(_), Some(_)) => {
            return Err(
                "has both command and url; give exactly one (command for stdio, url for HTTP)"
                    .into(),
            )
        }
        (None, None) => {
            return Err(
                "has neither command (stdio server) nor url (streamable HTTP server)".into(),
            )
        }
        (Some(command), None) => {
            check_kind(raw.kind.as_deref(), "stdio", &["stdio"])?;
            if raw.headers.is_some() {
                return Err("headers is for url servers, not command".into());
            }
            if command.trim().is_empty() {
                return Err("command is empty".into());
            }
            if let Some(cwd) = &raw.cwd {
                check_dir(cwd)?;
            }
            let mut expanded = BTreeMap::new();
            for (key, value) in raw.env.unwrap_or_default() {
                if key.is_empty() || key.contains('=') || key.contains('\0') {
                    return Err(format!("env name {key:?} is not a variable name"));
                }
                let value = expand(&value, env).map_err(|e| format!("env {key}: {e}"))?;
                if value.contains('\0') {
                    return Err(format!("env {key}: the value holds a NUL character"));
                }
                expanded.insert(key, value);
            }
            TransportSpec::Stdio {
                command,
                args: raw.args.unwrap_or_default(),
                env: expanded,
                cwd: raw.cwd,
            }
        }
        (None, Some(url)) => {
            check_kind(raw.kind.as_deref(), "http", &["http", "streamable-http"])?;
            for (field, present) in [
                ("args", raw.args.is_some()),
                ("env", raw.env.is_some()),
                ("cwd", raw.cwd.is_some()),
            ] {
                if present {
                    return Err(format!("{field} is for command (stdio) servers, not url"));
                }
            }
            check_url(&url)?;
            let mut expanded = BTreeMap::new();
            for (header, value) in raw.headers.unwrap_or_default() {
                let value = expand(&value, env).map_err(|e| format!("headers {header}: {e}"))?;
                check_header(&header, &value)?;
                expanded.insert(header, value);
            }
            TransportSpec::Http {
                url,
                headers: expanded,
            }
        }
    };
    Ok(ServerSpec {
        name,
        transport,
        scope: raw.scope,
        startup_timeout,
    })
}

/// An optional `type` must name the transport the other fields give.
fn check_kind(kind: Option<&str>, transport: &str, accepted: &[&str]) -> Result<(), String> {
    match kind {
        None => Ok(()),
        Some(kind) if accepted.contains(&kind) => Ok(()),
        Some("sse") => Err(
            "type \"sse\" (the legacy HTTP+SSE transport) is not supported; use a streamable HTTP url"
                .into(),
        ),
        Some(kind) => Err(format!(
            "type {kind:?} does not match the {transport} server the other fields describe"
        )),
    }
}

fn check_dir(cwd: &Path) -> Result<(), String> {
    match std::fs::metadata(cwd) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(format!("cwd {} is not a directory", cwd.display())),
        Err(e) => Err(format!("cwd {}: {e}", cwd.display())),
    }
}

fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest_mcp::Url::parse(url).map_err(|e| format!("url {url:?}: {e}"))?;
    match parsed.scheme() {
        "http" | "https" => Ok(()),
        other => Err(format!(
            "url {url:?}: scheme {other:?} is not http or https"
        )),
    }
}

fn check_header(name: &str, value: &str) -> Result<(), String> {
    let header = reqwest_mcp::header::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("headers: {name:?} is not a valid header name"))?;
    if RESERVED_HEADERS.contains(&header.as_str()) {
        return Err(format!(
            "headers: {name} is set by the MCP transport and cannot be configured"
        ));
    }
    reqwest_mcp::header::HeaderValue::from_str(value)
        .map_err(|_| format!("headers {name}: the value is not a valid header value"))?;
    Ok(())
}

/// Replaces each `${NAME}` in `value` with `env(NAME)`; `$${` is a literal `${`.
fn expand(value: &str, env: &impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        if let Some(escaped) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = escaped;
        } else if let Some(reference) = after.strip_prefix("${") {
            let Some(end) = reference.find('}') else {
                return Err("\"${\" without a closing \"}\"".into());
            };
            let name = &reference[..end];
            let valid = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                return Err(format!("${{{name}}} is not a variable reference"));
            }
            let Some(found) = env(name) else {
                return Err(format!(
                    "${{{name}}} refers to an environment variable that is not set"
                ));
            };
            out.push_str(&found);
            rest = &reference[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cret".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn parsed(json: &str) -> Result<Vec<ServerSpec>, String> {
        parse(json, env)
    }

    fn refused(json: &str) -> String {
        parsed(json).expect_err("refused")
    }

    #[test]
    fn stdio_and_http_servers_are_read_with_defaults() {
        let servers = parsed(
            r#"{"mcpServers": {
                "files": {"command": "mcp-files", "args": ["-v"], "env": {"A": "x${TOKEN}y"}},
                "search": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"},
                           "scope": "task", "startup_timeout_s": 2.5, "type": "http"}
            }}"#,
        )
        .expect("valid");
        assert_eq!(servers.len(), 2);
        let files = &servers[0];
        assert_eq!(files.name, "files");
        assert_eq!(files.scope, ServerScope::Worker);
        assert_eq!(files.startup_timeout, DEFAULT_STARTUP_TIMEOUT);
        let TransportSpec::Stdio {
            command,
            args,
            env,
            cwd,
        } = &files.transport
        else {
            panic!("stdio expected: {files:?}");
        };
        assert_eq!(command, "mcp-files");
        assert_eq!(args, &["-v"]);
        assert_eq!(env.get("A").map(String::as_str), Some("xs3crety"));
        assert!(cwd.is_none());
        let search = &servers[1];
        assert_eq!(search.scope, ServerScope::Task);
        assert_eq!(search.startup_timeout, Duration::from_millis(2500));
        let TransportSpec::Http { url, headers } = &search.transport else {
            panic!("http expected: {search:?}");
        };
        assert_eq!(url, "https://example.com/mcp");
        assert_eq!(
            headers.get("Authorization").map(String::as_str),
            Some("Bearer s3cret")
        );
    }

    #[test]
    fn secrets_are_not_in_debug_output() {
        let servers = parsed(
            r#"{"mcpServers": {"a": {"url": "http://h/mcp", "headers": {"X-Key": "${TOKEN}"}},
                               "b": {"command": "c", "env": {"K": "${TOKEN}"}}}}"#,
        )
        .expect("valid");
        let shown = format!("{servers:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("X-Key") && shown.contains("\"K\""),
            "{shown}"
        );
    }

    #[test]
    fn an_empty_file_has_no_servers() {
        assert_eq!(parsed(r#"{"mcpServers": {}}"#), Ok(Vec::new()));
    }

    #[test]
    fn bad_entries_are_refused_naming_the_server_and_field() {
        let cases: &[(&str, &[&str])] = &[
            (
                r#"{"mcpServers": {"s": {"command": "c", "colour": "red"}}}"#,
                &["\"s\"", "colour"],
            ),
            (
                r#"{"mcpServers": {"s": {"command": "c", "url": "http://h"}}}"#,
                &["\"s\"", "both command and url"],
            ),
            (
                r#"{"mcpServers": {"s": {"args": ["x"]}}}"#,
                &["\"s\"", "neither command"],
            ),
            (
                r#"{"mcpServers": {"bad name": {"command": "c"}}}"#,
                &["\"bad name\"", "A-Z a-z"],
            ),
            (
                r#"{"mcpServers": {"": {"command": "c"}}}"#,
                &["\"\"", "1-32"],
            ),
            (
                r#"{"mcpServers": {"s": {"command": "c", "scope": "session"}}}"#,
                &["\"s\"", "session", "worker"],
            ),
            (
                r#"{"mcpServers": {"s": {"url": "ftp://h/x"}}}"#,
                &["\"s\"", "ftp"],
            ),
            (
                r#"{"mcpServers": {"s": {"url": "not a url"}}}"#,
                &["\"s\"", "url"],
            ),
            (
                r#"{"mcpServers": {"s": {"url": "http://h", "env": {}}}}"#,
                &["\"s\"", "env is for command"],
            ),
            (
                r#"{"mcpServers": {"s": {"command": "c", "headers": {}}}}"#,
                &["\"s\"", "headers is for url"],
            ),
            (
                r#"{"mcpServers": {"s": {"command": "c", "env": {"A": "${MISSING}"}}}}"#,
                &["\"s\"", "env A", "MISSING", "not set"],
            ),
            (
                r#"{"mcpServers": {"s": {"url": "http://h", "headers": {"X": "${TOKEN"}}}}"#,
                &["\"s\"", "headers X", "closing"],
            ),
            (
                r#"{"mcpServers": {"s": {"url": "http://h", "headers": {"Accept": "x"}}}}"#,
                &["\"s\"", "Accept", "MCP transport"],
            ),
            (
                r#"{"mcpServers": {"s": {"url": "http://h", "headers": {"X": "a\nb"}}}}"#,
                &["\"s\"", "headers X", "valid header value"],
            ),
            (
                r#"{"mcpServers": {"s": {"command": "c", "startup_timeout_s": 0}}}"#,
                &["\"s\"", "startup_timeout_s"],
            ),
            (
                r#"{"mcpServers": {"s": {"command": "c", "type": "http"}}}"#,
                &["\"s\"", "type \"http\""],
            ),
            (
                r#"{"mcpServers": {"s": {"url": "http://h", "type": "sse"}}}"#,
                &["\"s\"", "legacy"],
            ),
            (
                r#"{"mcpServers": {"s": {"command": "  "}}}"#,
                &["\"s\"", "command is empty"],
            ),
            (
                r#"{"mcpServers": {"s": {"command": "c", "cwd": "/no/such/dir/anywhere"}}}"#,
                &["\"s\"", "cwd"],
            ),
            (r#"{"servers": {}}"#, &["servers"]),
            (
                r#"{"mcpServers": {"s": {"command": 7}}}"#,
                &["\"s\"", "invalid type"],
            ),
            ("not json", &["expected"]),
        ];
        for (json, needles) in cases {
            let message = refused(json);
            for needle in *needles {
                assert!(
                    message.contains(needle),
                    "{json}: {message:?} lacks {needle:?}"
                );
            }
        }
    }

    #[test]
    fn expansion_replaces_references_only() {
        assert_eq!(expand("plain", &env), Ok("plain".into()));
        assert_eq!(expand("${TOKEN}", &env), Ok("s3cret".into()));
        assert_eq!(expand("a${EMPTY}b", &env), Ok("ab".into()));
        assert_eq!(expand("$TOKEN and $", &env), Ok("$TOKEN and $".into()));
        assert_eq!(expand("$${TOKEN}", &env), Ok("${TOKEN}".into()));
        assert_eq!(expand("${TOKEN}${TOKEN}", &env), Ok("s3crets3cret".into()));
        assert!(expand("${}", &env).is_err());
        assert!(expand("${1X}", &env).is_err());
        assert!(expand("${A-B}", &env).is_err());
        assert!(expand("${UNSET}", &env).is_err());
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let cfg = McpConfig {
            mcp_config: Some(PathBuf::from("/no/such/mcp.json")),
        };
        let message = cfg.validate().expect_err("refused");
        assert!(message.contains("/no/such/mcp.json"), "{message}");
        assert!(McpConfig::default().validate().is_ok());
    }
}
