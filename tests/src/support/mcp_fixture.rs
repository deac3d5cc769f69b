//! A small, real MCP server for the MCP tests and the soak, built with rmcp's server side.
//!
//! `skein-mcp-fixture` serves MCP on stdin/stdout; `skein-mcp-fixture --http PORT` serves
//! streamable HTTP at `http://127.0.0.1:PORT/mcp` instead. `--helper-child` starts a `sleep`
//! child in the server's process group at start-up, to show that closing kills the whole group.
//!
//! Environment: `SKEIN_MCP_FIXTURE_STARTS` names a file each start appends its pid to (one line);
//! `SKEIN_MCP_FIXTURE_RECORD` names the file the `record` tool appends to.
//!
//! Tools: `echo {text}` (read-only), `record {effect}` (appends `<idempotency key> <effect>`, the key
//! read from the request's `_meta`), `crash` (exits at once, without answering), `pid` (the
//! process id, process group and helper child's id as JSON), `sleep {ms}`, `fail {message}` (an
//! `isError` result), `wipe` (declared destructive; does nothing), `header {name}` (a request
//! header's value, over HTTP), `image {bytes?}` (a caption and a PNG image: [`FIXTURE_PNG`], or
//! one of `bytes` bytes).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};

/// The image the `image` tool returns (a 1x1 PNG), base64.
pub const FIXTURE_PNG: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

/// The `_meta` key the worker puts the call's idempotency key under.
const IDEMPOTENCY_META_KEY: &str = "skein/idempotency-key";

#[derive(Debug, Clone)]
struct Fixture {
    record: Option<PathBuf>,
    helper: Option<u32>,
}

fn schema(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

fn tools() -> Vec<Tool> {
    let no_arguments = || schema(json!({"type": "object", "properties": {}}));
    vec![
        Tool::new(
            "echo",
            "Returns its text unchanged.",
            schema(json!({
                "type": "object",
                "properties": {"text": {"type": "string", "description": "What to echo."}},
                "required": ["text"]
            })),
        )
        .with_annotations(ToolAnnotations::new().read_only(true)),
        Tool::new(
            "record",
            "Appends the call's idempotency key and the effect to the record file.",
            schema(json!({
                "type": "object",
                "properties": {"effect": {"type": "string"}},
                "required": ["effect"]
            })),
        )
        .with_annotations(ToolAnnotations::new().read_only(false).destructive(false)),
        Tool::new("crash", "Exits the server at once.", no_arguments()),
        Tool::new(
            "pid",
            "The server's process id, process group and helper child.",
            no_arguments(),
        ),
        Tool::new(
            "sleep",
            "Waits ms milliseconds.",
            schema(json!({
                "type": "object",
                "properties": {"ms": {"type": "integer", "minimum": 0}},
                "required": ["ms"]
            })),
        ),
        Tool::new(
            "fail",
            "Reports a tool error with the message.",
            schema(json!({
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"]
            })),
        ),
        Tool::new(
            "wipe",
            "Declared destructive; does nothing.",
            no_arguments(),
        )
        .with_annotations(ToolAnnotations::new().destructive(true)),
        Tool::new(
            "image",
            "Returns a caption and a PNG image (of `bytes` bytes when given).",
            schema(json!({
                "type": "object",
                "properties": {"bytes": {"type": "integer", "minimum": 1}}
            })),
        )
        .with_annotations(ToolAnnotations::new().read_only(true)),
        Tool::new(
            "header",
            "The value of an HTTP request header of this call.",
            schema(json!({
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"]
            })),
        ),
    ]
}

fn text(value: impl Into<String>) -> Result<CallToolResponse, ErrorData> {
    Ok(CallToolResult::success(vec![ContentBlock::text(value)]).into())
}

fn string_argument(arguments: &JsonObject, name: &str) -> Result<String, ErrorData> {
    arguments
        .get(name)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| ErrorData::invalid_params(format!("{name} (a string) is required"), None))
}

/// The process group of this process, from procfs.
fn process_group() -> Option<u32> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (_, after_comm) = stat.rsplit_once(')')?;
    after_comm.split_whitespace().nth(2)?.parse().ok()
}

impl Fixture {
    fn record(&self, key: &str, effect: &str) -> Result<CallToolResponse, ErrorData> {
        let Some(path) = &self.record else {
            return Err(ErrorData::internal_error(
                "SKEIN_MCP_FIXTURE_RECORD is not set",
                None,
            ));
        };
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut file| writeln!(file, "{key} {effect}"));
        match written {
            Ok(()) => text("recorded"),
            Err(e) => Err(ErrorData::internal_error(format!("record: {e}"), None)),
        }
    }
}

impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.clone().unwrap_or_default();
        match request.name.as_ref() {
            "echo" => text(string_argument(&arguments, "text")?),
            "record" => {
                let effect = string_argument(&arguments, "effect")?;
                let key = context
                    .meta
                    .0
                     .0
                    .get(IDEMPOTENCY_META_KEY)
                    .or_else(|| {
                        request
                            .meta
                            .as_ref()
                            .and_then(|meta| meta.0 .0.get(IDEMPOTENCY_META_KEY))
                    })
                    .and_then(Value::as_str)
                    .unwrap_or("<no-key>")
                    .to_owned();
                self.record(&key, &effect)
            }
            "crash" => std::process::exit(3),
            "pid" => text(
                json!({
                    "pid": std::process::id(),
                    "pgid": process_group(),
                    "helper": self.helper,
                })
                .to_string(),
            ),
            "sleep" => {
                let ms = arguments.get("ms").and_then(Value::as_u64).ok_or_else(|| {
                    ErrorData::invalid_params("ms (an integer) is required", None)
                })?;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                text("slept")
            }
            "fail" => Ok(
                CallToolResult::error(vec![ContentBlock::text(string_argument(
                    &arguments, "message",
                )?)])
                .into(),
            ),
            "wipe" => text("nothing wiped"),
            "image" => {
                use base64::Engine;
                let data = match arguments.get("bytes").and_then(Value::as_u64) {
                    Some(size) => base64::engine::general_purpose::STANDARD
                        .encode(vec![0x89u8; usize::try_from(size).unwrap_or(0)]),
                    None => FIXTURE_PNG.to_owned(),
                };
                Ok(CallToolResult::success(vec![
                    ContentBlock::text("a red dot"),
                    ContentBlock::image(data, "image/png"),
                ])
                .into())
            }
            "header" => {
                let name = string_argument(&arguments, "name")?;
                let value = context
                    .extensions
                    .get::<axum::http::request::Parts>()
                    .and_then(|parts| parts.headers.get(name.as_str()))
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or("<absent>")
                    .to_owned();
                text(value)
            }
            other => Err(ErrorData::invalid_params(
                format!("no tool named {other}"),
                None,
            )),
        }
    }
}

fn note_start() -> std::io::Result<()> {
    if let Some(path) = std::env::var_os("SKEIN_MCP_FIXTURE_STARTS") {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        writeln!(file, "{}", std::process::id())?;
    }
    Ok(())
}

/// Runs the fixture with `args` (without the program name).
pub fn main_from(args: Vec<String>) -> std::process::ExitCode {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(serve(args)),
        Err(e) => {
            eprintln!("skein-mcp-fixture: cannot start the async runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(args: Vec<String>) -> std::process::ExitCode {
    let mut http_port: Option<u16> = None;
    let mut helper_child = false;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--http" => match rest.next().and_then(|p| p.parse().ok()) {
                Some(port) => http_port = Some(port),
                None => {
                    eprintln!("skein-mcp-fixture: --http takes a port number");
                    return std::process::ExitCode::from(64);
                }
            },
            "--helper-child" => helper_child = true,
            other => {
                eprintln!("skein-mcp-fixture: unknown argument {other:?}");
                return std::process::ExitCode::from(64);
            }
        }
    }
    // The helper stays in this process's group; whoever closes the server must kill the group.
    let helper = if helper_child {
        match std::process::Command::new("sleep").arg("300").spawn() {
            Ok(child) => Some(child.id()),
            Err(e) => {
                eprintln!("skein-mcp-fixture: cannot start the helper child: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    if let Err(e) = note_start() {
        eprintln!("skein-mcp-fixture: cannot note the start: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let fixture = Fixture {
        record: std::env::var_os("SKEIN_MCP_FIXTURE_RECORD").map(PathBuf::from),
        helper,
    };
    eprintln!("skein-mcp-fixture {} started", std::process::id());
    let served = match http_port {
        None => serve_stdio(fixture).await,
        Some(port) => serve_http(fixture, port).await,
    };
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skein-mcp-fixture: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve_stdio(fixture: Fixture) -> Result<(), String> {
    let running = fixture
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("stdio handshake: {e}"))?;
    running
        .waiting()
        .await
        .map(|_| ())
        .map_err(|e| format!("stdio service: {e}"))
}

async fn serve_http(fixture: Fixture, port: u16) -> Result<(), String> {
    let service: StreamableHttpService<Fixture, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(fixture.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
    axum::serve(listener, router)
        .await
        .map_err(|e| format!("http: {e}"))
}
