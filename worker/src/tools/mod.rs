//! The worker's tool contract ([`Tool`]), the registry that runs tools by name
//! ([`ToolRegistry`]), and the built-in tool set ([`builtin_registry`]).
//!
//! Invariants:
//! - a tool never sees arguments that failed to decode into its `Args` type: decoding is the
//!   validation, and every problem (not an object, wrong type, missing or unknown field) comes back
//!   as [`ToolError::InvalidArguments`] naming it; every `Args` type uses
//!   `#[serde(deny_unknown_fields)]` so the schema the model sees and what is accepted agree;
//! - the JSON Schema a tool advertises is generated once, at registration, from its `Args` type;
//! - output handed back is at most `max_output_bytes` plus a one-line truncation note, cut at a
//!   char boundary;
//! - a tool's images ([`ToolOutput::images`], from dynamic tools such as MCP servers') are
//!   handed back beside its text, never folded into it;
//! - tools hold only shared, borrowed things (paths, the HTTP pool); whatever a call opens for
//!   itself goes into the call's [`TaskScope`].

pub mod edit;
pub mod fs;
pub mod glob;
pub mod grep;
pub mod http;
pub mod shell;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;
pub use skein_common::protocol::ToolEffects;
use skein_common::protocol::{Failure, FailureKind, TaskOrigin, ToolSpec};

use crate::scope::TaskScope;

/// Output cap of a registry unless configured otherwise.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// A tool a worker can run.
pub trait Tool: Send + Sync + 'static {
    /// The name the model calls the tool by.
    const NAME: &'static str;
    /// The decoded arguments; its JSON Schema is what the model sees.
    type Args: serde::de::DeserializeOwned + schemars::JsonSchema + Send;

    /// What the tool does, for the model.
    fn description(&self) -> String;

    /// False when two calls of this tool must not run at the same time.
    fn concurrency_safe(&self) -> bool {
        true
    }

    /// What the tool declares about its effects; permission modes decide by it (`read_only`
    /// allows only read-only tools, `default` asks before destructive ones, `accept_edits` allows
    /// workspace edits unasked). Default: none declared.
    fn effects(&self) -> ToolEffects {
        ToolEffects::default()
    }

    fn call(
        &self,
        args: Self::Args,
        ctx: ToolContext<'_>,
    ) -> impl Future<Output = Result<String, ToolError>> + Send;
}

/// What a tool call knows about where it runs.
#[derive(Debug)]
pub struct ToolContext<'a> {
    pub origin: &'a TaskOrigin,
    pub call_id: &'a str,
    /// The same for every run of this call (redeliveries, other workers), different for every
    /// other call: tools that change the outside world send it along (`Idempotency-Key` on HTTP,
    /// `_meta` on MCP) so a call run twice is applied once. See [`idempotency_key`].
    pub idempotency_key: &'a str,
    /// How long the call may run in all (its own limit, the task's deadline and the worker's
    /// tool timeout): a tool that can answer with partial work does so before it.
    pub time_limit: Duration,
    /// Owns whatever the call opens for itself.
    pub scope: &'a mut TaskScope,
}

/// Why a tool call failed, by condition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    #[error("denied: {0}")]
    Denied(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("failed: {0}")]
    Failed(String),
    #[error("timed out")]
    TimedOut,
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("too large: {0}")]
    TooLarge(String),
}

impl ToolError {
    /// The failure as protocol data; retryability follows the kind.
    pub fn to_failure(&self) -> Failure {
        let (kind, message) = match self {
            ToolError::InvalidArguments(m) => (FailureKind::InvalidArguments, m.clone()),
            ToolError::Denied(m) => (FailureKind::Denied, m.clone()),
            ToolError::NotFound(m) => (FailureKind::ToolFailed, m.clone()),
            ToolError::Failed(m) => (FailureKind::ToolFailed, m.clone()),
            ToolError::TimedOut => (FailureKind::TimedOut, "the tool call timed out".to_owned()),
            ToolError::Unavailable(m) => (FailureKind::Unavailable, m.clone()),
            ToolError::TooLarge(m) => (FailureKind::TooLarge, m.clone()),
        };
        Failure::new(kind, message)
    }
}

impl From<ToolError> for Failure {
    fn from(error: ToolError) -> Self {
        error.to_failure()
    }
}

/// What a tool call returns: its text, and the images it returned besides (an MCP tool's image
/// content).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolOutput {
    pub text: String,
    pub images: Vec<ToolImage>,
}

/// An image a tool returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolImage {
    /// Its type (`image/png`).
    pub media_type: String,
    /// Its bytes.
    pub data: bytes::Bytes,
}

impl From<String> for ToolOutput {
    fn from(text: String) -> Self {
        Self {
            text,
            images: Vec::new(),
        }
    }
}

/// A tool known only at run time (an MCP server's tools, say): its spec comes with it and it
/// takes raw JSON arguments, checking them itself. Registered with
/// [`ToolRegistry::register_dynamic`].
pub trait DynamicTool: Send + Sync + 'static {
    fn call<'a>(
        &'a self,
        arguments: Value,
        ctx: ToolContext<'a>,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>>;
}

/// The object-safe face of a [`Tool`]: decodes arguments, then calls it.
trait ErasedTool: Send + Sync {
    fn call<'a>(
        &'a self,
        arguments: Value,
        ctx: ToolContext<'a>,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>>;
}

struct Erased<T>(T);

impl<T: Tool> ErasedTool for Erased<T> {
    fn call<'a>(
        &'a self,
        arguments: Value,
        ctx: ToolContext<'a>,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let args = decode_arguments::<T::Args>(T::NAME, arguments)?;
            self.0.call(args, ctx).await.map(ToolOutput::from)
        })
    }
}

/// Decodes tool arguments; `null` counts as `{}` (models send it for tools without arguments).
fn decode_arguments<A: serde::de::DeserializeOwned>(
    tool: &str,
    arguments: Value,
) -> Result<A, ToolError> {
    let arguments = match arguments {
        Value::Object(_) => arguments,
        Value::Null => Value::Object(serde_json::Map::new()),
        other => {
            return Err(ToolError::InvalidArguments(format!(
                "{tool} takes a JSON object of arguments, got {}",
                describe_json(&other)
            )))
        }
    };
    serde_json::from_value(arguments)
        .map_err(|e| ToolError::InvalidArguments(format!("{tool}: {e}")))
}

fn describe_json(value: &Value) -> String {
    const PREVIEW_CHARS: usize = 60;
    let kind = skein_common::protocol::content::json_kind(value);
    let text = value.to_string();
    let preview: String = text.chars().take(PREVIEW_CHARS).collect();
    let ellipsis = if preview.len() < text.len() {
        "..."
    } else {
        ""
    };
    format!("{kind} ({preview}{ellipsis})")
}

struct Dynamic(std::sync::Arc<dyn DynamicTool>);

impl ErasedTool for Dynamic {
    fn call<'a>(
        &'a self,
        arguments: Value,
        ctx: ToolContext<'a>,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        self.0.call(arguments, ctx)
    }
}

struct Registered {
    spec: ToolSpec,
    tool: Box<dyn ErasedTool>,
}

/// Tools by name, with their specs, ready to be called with raw JSON arguments.
pub struct ToolRegistry {
    tools: BTreeMap<String, Registered>,
    max_output_bytes: usize,
}

impl Default for ToolRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("tools", &self.names())
            .field("max_output_bytes", &self.max_output_bytes)
            .finish()
    }
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self {
            tools: BTreeMap::new(),
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        }
    }

    /// Sets the output cap (default [`DEFAULT_MAX_OUTPUT_BYTES`]).
    pub fn with_max_output_bytes(mut self, max_output_bytes: usize) -> Self {
        self.max_output_bytes = max_output_bytes;
        self
    }

    pub fn max_output_bytes(&self) -> usize {
        self.max_output_bytes
    }

    /// Adds `tool` under `T::NAME`, replacing any tool of that name.
    pub fn register<T: Tool>(&mut self, tool: T) {
        let spec = ToolSpec {
            name: T::NAME.to_owned(),
            description: tool.description(),
            parameters: schema_of::<T::Args>(),
            concurrency_safe: tool.concurrency_safe(),
            effects: tool.effects(),
        };
        let entry = Registered {
            spec,
            tool: Box::new(Erased(tool)),
        };
        if self.tools.insert(T::NAME.to_owned(), entry).is_some() {
            tracing::warn!(tool = T::NAME, "tool registered twice; the last one wins");
        }
    }

    /// Adds a tool known only at run time under `spec.name`, replacing any tool of that name.
    pub fn register_dynamic(&mut self, spec: ToolSpec, tool: std::sync::Arc<dyn DynamicTool>) {
        let name = spec.name.clone();
        let entry = Registered {
            spec,
            tool: Box::new(Dynamic(tool)),
        };
        if self.tools.insert(name.clone(), entry).is_some() {
            tracing::warn!(tool = %name, "tool registered twice; the last one wins");
        }
    }

    /// Tool names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// What the model sees of every tool, sorted by name.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|t| t.spec.clone()).collect()
    }

    pub fn spec(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.get(name).map(|t| &t.spec)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Keeps only the tools whose name `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.tools.retain(|name, _| keep(name));
    }

    /// Runs tool `name` with raw JSON `arguments`; its text, truncated over the cap (images it
    /// returned are left out: [`call_whole`](Self::call_whole) has them).
    pub async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: ToolContext<'_>,
    ) -> Result<String, ToolError> {
        let output = self.call_whole(name, arguments, ctx).await?;
        Ok(truncate_output(output.text, self.max_output_bytes))
    }

    /// [`call`](Self::call) with the output whole, however long (the worker keeps what is over
    /// the cap in the session's workspace), and its images.
    pub async fn call_whole(
        &self,
        name: &str,
        arguments: Value,
        ctx: ToolContext<'_>,
    ) -> Result<ToolOutput, ToolError> {
        let Some(entry) = self.tools.get(name) else {
            return Err(ToolError::NotFound(format!(
                "no tool named {name:?} on this worker (available: {})",
                self.names().join(", ")
            )));
        };
        entry.tool.call(arguments, ctx).await
    }
}

/// The JSON Schema of `A` as tool parameters (without the `$schema` marker).
fn schema_of<A: schemars::JsonSchema>() -> Value {
    let mut schema = schemars::schema_for!(A);
    schema.remove("$schema");
    schema.to_value()
}

/// The idempotency key of a call: a UUID (version 5) of the call's session and call key
/// (`protocol::call_key`: task, step, call id), so every run of the call has the same key, every
/// other call another, and nothing about the session can be read from it.
pub fn idempotency_key(origin: &TaskOrigin, call_key: &str) -> String {
    let name = format!("{}/{}/{}", origin.tenant, origin.session, call_key);
    uuid::Uuid::new_v5(&IDEMPOTENCY_NAMESPACE, name.as_bytes()).to_string()
}

/// The namespace of [`idempotency_key`]s (fixed: changing it changes every key).
const IDEMPOTENCY_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x5d1c_a0e4_3b7f_4c1e_9a62_0f4d_8e21_b7c3);

/// Cuts `output` to at most `max_bytes` (at a char boundary) and notes the original size.
pub(crate) fn truncate_output(mut output: String, max_bytes: usize) -> String {
    if output.len() <= max_bytes {
        return output;
    }
    let total = output.len();
    output.truncate(skein_common::text::floor_char_boundary(&output, max_bytes));
    output.push_str(&format!("\n[output truncated: {total} bytes total]"));
    output
}

/// Drops an incomplete UTF-8 sequence left at the end of `bytes` by a size cut, so the text does
/// not end in a replacement character. Leaves `bytes` alone when it holds nothing else.
pub(crate) fn trim_partial_utf8(bytes: &mut Vec<u8>) {
    if let Err(e) = std::str::from_utf8(bytes) {
        if e.error_len().is_none() && e.valid_up_to() > 0 {
            bytes.truncate(e.valid_up_to());
        }
    }
}

/// Settings of the built-in tools.
#[derive(Debug, Clone)]
pub struct BuiltinConfig {
    /// Where the file tools find session files (`crate::workspace::open` picks it).
    pub workspace: std::sync::Arc<dyn crate::workspace::WorkspaceStore>,
    /// Hosts `http_fetch` and `http_request` may reach: exact names, `*.suffix` patterns, or
    /// `*`; an IP literal also allows that address when it is private.
    pub http_allow: Vec<String>,
    /// Let the HTTP tools reach loopback, private, link-local and other non-public addresses.
    pub http_allow_private: bool,
    /// Most bytes of a response body `http_fetch` returns.
    pub http_max_bytes: usize,
    /// Bound on one `http_fetch` call, redirects included.
    pub http_timeout: Duration,
    /// Most bytes `read_file` returns per call.
    pub max_read_bytes: usize,
    /// `shell`'s setup; `None` leaves the tool out (it is off unless listed).
    pub shell: Option<shell::ShellSetup>,
}

/// Names of the built-in tools.
pub const BUILTIN_TOOLS: [&str; 9] = [
    "read_file",
    "write_file",
    "edit_file",
    "list_files",
    "glob_files",
    "grep_files",
    "http_fetch",
    "http_request",
    "shell",
];

/// A registry with the workspace file tools (`read_file`, `write_file`, `edit_file`,
/// `list_files`, `glob_files`, `grep_files`), `http_fetch` and `http_request`.
/// `http` is the worker's shared pool; build it with [`http::client`] and an
/// [`http::AddressPolicy`] of the same `http_allow` and `http_allow_private`, so redirects are
/// checked hop by hop and names are resolved to allowed addresses only. `shell` is added when
/// `cfg.shell` is set.
pub fn builtin_registry(cfg: &BuiltinConfig, http: reqwest::Client) -> ToolRegistry {
    let mut registry = ToolRegistry::new();
    registry.register(fs::ReadFile::new(cfg.workspace.clone(), cfg.max_read_bytes));
    registry.register(fs::WriteFile::new(cfg.workspace.clone()));
    registry.register(edit::EditFile::new(cfg.workspace.clone()));
    registry.register(fs::ListFiles::new(cfg.workspace.clone()));
    registry.register(glob::GlobFiles::new(cfg.workspace.clone()));
    registry.register(grep::GrepFiles::new(cfg.workspace.clone()));
    let http_settings = http::HttpSettings {
        allow: cfg.http_allow.clone(),
        allow_private: cfg.http_allow_private,
        max_bytes: cfg.http_max_bytes,
        timeout: cfg.http_timeout,
    };
    registry.register(http::HttpFetch::new(http.clone(), &http_settings));
    registry.register(http::HttpRequest::new(http, &http_settings));
    if let Some(setup) = &cfg.shell {
        registry.register(shell::Shell::new(setup.clone()));
    }
    registry
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Temporary directories and fixtures shared by the worker's unit tests.

    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use skein_common::protocol::TaskOrigin;

    use crate::scope::{ScopeStats, TaskScope};

    /// A unique directory under the system temp dir, removed on drop.
    pub struct TestDir(PathBuf);

    impl TestDir {
        pub fn new() -> Self {
            let path = std::env::temp_dir().join(format!(
                "skein-worker-test-{}",
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::create_dir_all(&path).expect("create test dir");
            // Canonical, so tests compare the paths tools return.
            Self(std::fs::canonicalize(&path).expect("canonical test dir"))
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    pub fn origin(tenant: &str, session: &str) -> TaskOrigin {
        TaskOrigin {
            task_id: "task-1".into(),
            tenant: tenant.into(),
            user: "user-1".into(),
            session: session.into(),
            workspace: session.into(),
            deadline_ms: None,
            budget: None,
            run_budget: None,
        }
    }

    pub fn scope(dir: &TestDir) -> TaskScope {
        TaskScope::new(
            Arc::new(ScopeStats::new()),
            dir.path().join("scratch"),
            "test",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{origin, scope, TestDir};
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    /// Echoes its text, repeated.
    struct Echo;

    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct EchoArgs {
        /// What to echo.
        text: String,
        /// How many times.
        #[serde(default)]
        times: Option<u32>,
    }

    impl Tool for Echo {
        const NAME: &'static str = "echo";
        type Args = EchoArgs;

        fn description(&self) -> String {
            "Echoes text.".into()
        }

        fn concurrency_safe(&self) -> bool {
            false
        }

        async fn call(&self, args: EchoArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
            let times = args.times.unwrap_or(1) as usize;
            Ok(format!("{}:{}", ctx.call_id, args.text.repeat(times)))
        }
    }

    async fn run(
        registry: &ToolRegistry,
        name: &str,
        arguments: Value,
    ) -> Result<String, ToolError> {
        let dir = TestDir::new();
        let mut scope = scope(&dir);
        let origin = origin("acme", "s1");
        let ctx = ToolContext {
            origin: &origin,
            call_id: "c1",
            idempotency_key: "key-1",
            time_limit: std::time::Duration::from_secs(60),
            scope: &mut scope,
        };
        let result = registry.call(name, arguments, ctx).await;
        scope.close().await.expect("scope closes");
        result
    }

    fn echo_registry() -> ToolRegistry {
        let mut registry = ToolRegistry::new();
        registry.register(Echo);
        registry
    }

    #[tokio::test]
    async fn calls_a_tool_with_decoded_arguments() {
        let registry = echo_registry();
        let output = run(&registry, "echo", json!({"text": "hi", "times": 2})).await;
        assert_eq!(output, Ok("c1:hihi".to_owned()));
    }

    #[tokio::test]
    async fn bad_arguments_are_invalid_arguments_naming_the_problem() {
        let registry = echo_registry();
        let cases = [
            (json!({"text": 3}), "invalid type"),
            (json!({}), "missing field `text`"),
            (json!({"text": "x", "loud": true}), "unknown field `loud`"),
            (json!("{\"text\": \"x\"}"), "got a string"),
            (json!([1]), "got an array"),
        ];
        for (arguments, expected) in cases {
            match run(&registry, "echo", arguments.clone()).await {
                Err(ToolError::InvalidArguments(message)) => {
                    assert!(message.contains(expected), "{arguments}: {message}")
                }
                other => panic!("{arguments}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn unknown_tools_are_not_found() {
        let registry = echo_registry();
        let error = run(&registry, "nope", json!({}))
            .await
            .expect_err("unknown");
        assert!(matches!(error, ToolError::NotFound(ref m) if m.contains("nope")));
        assert_eq!(error.to_failure().kind, FailureKind::ToolFailed);
    }

    #[tokio::test]
    async fn long_output_is_cut_at_a_char_boundary() {
        let registry = echo_registry().with_max_output_bytes(10);
        let output = run(&registry, "echo", json!({"text": "é", "times": 20}))
            .await
            .expect("ok");
        // "c1:" is 3 bytes, each "é" 2: the cut lands inside one and backs off to 9 bytes.
        assert_eq!(output, "c1:ééé\n[output truncated: 43 bytes total]");
    }

    #[test]
    fn specs_carry_the_args_schema() {
        let registry = echo_registry();
        let specs = registry.specs();
        assert_eq!(specs.len(), 1);
        let spec = &specs[0];
        assert_eq!(spec.name, "echo");
        assert!(!spec.concurrency_safe);
        assert_eq!(spec.parameters["type"], "object");
        assert_eq!(spec.parameters["additionalProperties"], false);
        assert_eq!(spec.parameters["required"], json!(["text"]));
        assert_eq!(
            spec.parameters["properties"]["text"]["description"],
            "What to echo."
        );
        assert!(spec.parameters.get("$schema").is_none());
    }

    #[test]
    fn retain_keeps_a_subset() {
        let dir = TestDir::new();
        let cfg = BuiltinConfig {
            workspace: std::sync::Arc::new(crate::workspace::VolumeFiles::new(
                dir.path(),
                skein_common::workspace::Limits::default(),
            )),
            http_allow: Vec::new(),
            http_allow_private: false,
            http_max_bytes: 1024,
            http_timeout: Duration::from_secs(1),
            max_read_bytes: 1024,
            shell: None,
        };
        let mut registry = builtin_registry(&cfg, reqwest::Client::new());
        assert_eq!(
            registry.names(),
            [
                "edit_file",
                "glob_files",
                "grep_files",
                "http_fetch",
                "http_request",
                "list_files",
                "read_file",
                "write_file"
            ]
        );
        registry.retain(|name| name.ends_with("_file"));
        assert_eq!(registry.names(), ["edit_file", "read_file", "write_file"]);
        assert!(registry.contains("read_file") && !registry.contains("list_files"));
    }

    #[test]
    fn failures_map_to_protocol_kinds() {
        let cases = [
            (
                ToolError::InvalidArguments("a".into()),
                FailureKind::InvalidArguments,
                false,
            ),
            (ToolError::Denied("a".into()), FailureKind::Denied, false),
            (
                ToolError::NotFound("a".into()),
                FailureKind::ToolFailed,
                false,
            ),
            (
                ToolError::Failed("a".into()),
                FailureKind::ToolFailed,
                false,
            ),
            (ToolError::TimedOut, FailureKind::TimedOut, true),
            (
                ToolError::Unavailable("a".into()),
                FailureKind::Unavailable,
                true,
            ),
            (
                ToolError::TooLarge("a".into()),
                FailureKind::TooLarge,
                false,
            ),
        ];
        for (error, kind, retryable) in cases {
            let failure = error.to_failure();
            assert_eq!(
                (failure.kind, failure.retryable),
                (kind, retryable),
                "{error}"
            );
        }
    }

    #[test]
    fn registry_calls_can_be_spawned() {
        fn assert_send_sync<T: Send + Sync + 'static>(_: &T) {}
        fn assert_send<T: Send>(_: &T) {}
        let registry = echo_registry();
        assert_send_sync(&registry);
        let mut scope = scope(&TestDir::new());
        let origin = origin("acme", "s1");
        let ctx = ToolContext {
            origin: &origin,
            call_id: "c1",
            idempotency_key: "key-1",
            time_limit: std::time::Duration::from_secs(60),
            scope: &mut scope,
        };
        assert_send(&registry.call("echo", json!({"text": "x"}), ctx));
    }

    #[test]
    fn partial_utf8_is_trimmed() {
        let mut bytes = "aé".as_bytes()[..2].to_vec();
        trim_partial_utf8(&mut bytes);
        assert_eq!(bytes, b"a");
    }
}
