//! MCP tools as worker tools: their names (`mcp__<server>__<tool>`), their specs (the server's
//! input schema and description, effects from its annotations), and calls (the call's idempotency
//! key in the request's `_meta`, the result turned into text and images).
//!
//! Invariants:
//! - a registered name matches `^[A-Za-z0-9_-]{1,64}$` (what model APIs accept for function
//!   names, and a subject token): characters outside it become `_`, and a name that is still too
//!   long is refused, never cut (a cut could make two tools one);
//! - every request carries `{"skein/idempotency-key": <key>}` in `_meta`;
//! - a failure is always a [`ToolError`] the model sees: the server not reachable before the call
//!   is `Unavailable` (nothing ran, so the worker may try again), the server going away during the
//!   call is `Failed` (it may have run), `isError` results are `Failed` with the tool's text;
//! - an image block of a type models take becomes one of the result's images (its place in the
//!   text marked `[image n: <type>, <bytes> bytes]`); one of another type is described in the text
//!   only, saying why; one that is not base64 fails the call.

use std::sync::Arc;

use futures::future::BoxFuture;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, ErrorCode, JsonObject, MetaObject,
    RequestMetaObject, ResourceContents, Tool, ToolAnnotations,
};
use rmcp::service::ServiceError;
use rmcp::{Peer, RoleClient};
use serde_json::Value;
use skein_common::protocol::{ToolEffects, ToolSpec};

use super::config::ServerSpec;
use super::connection::{Connection, Shared};
use super::supervisor::WorkerServer;
use crate::tools::{DynamicTool, ToolContext, ToolError, ToolImage, ToolOutput};

/// What every MCP tool name starts with.
pub const TOOL_PREFIX: &str = "mcp__";

/// Longest tool name (model APIs accept 64 characters).
pub const MAX_TOOL_NAME_LEN: usize = 64;

/// The `_meta` key that carries the call's idempotency key.
pub const IDEMPOTENCY_META_KEY: &str = "skein/idempotency-key";

/// The worker's name for `tool` of `server`, or why it has none.
pub fn tool_name(server: &str, tool: &str) -> Result<String, String> {
    if tool.is_empty() {
        return Err("the server lists a tool without a name".into());
    }
    let sanitized: String = tool
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = format!("{TOOL_PREFIX}{server}__{sanitized}");
    if name.len() > MAX_TOOL_NAME_LEN {
        return Err(format!(
            "{name} is longer than {MAX_TOOL_NAME_LEN} characters (shorten the server's name)"
        ));
    }
    Ok(name)
}

/// What MCP annotations declare, as effects: `readOnlyHint: true` is read-only,
/// `destructiveHint: true` (on a tool not read-only) is destructive. Absent hints declare
/// nothing (MCP's default of "destructive" for unannotated tools is not applied).
pub fn effects(annotations: Option<&ToolAnnotations>) -> ToolEffects {
    let Some(annotations) = annotations else {
        return ToolEffects::default();
    };
    let read_only = annotations.read_only_hint == Some(true);
    ToolEffects {
        read_only,
        destructive: !read_only && annotations.destructive_hint == Some(true),
        edits_workspace: false,
    }
}

/// The spec the model sees of `tool`, registered as `name`.
pub fn spec(name: String, tool: &Tool) -> ToolSpec {
    let description = tool
        .description
        .as_deref()
        .map(str::to_owned)
        .or_else(|| tool.title.clone())
        .or_else(|| tool.annotations.as_ref().and_then(|a| a.title.clone()))
        .unwrap_or_default();
    ToolSpec {
        name,
        description,
        parameters: Value::Object((*tool.input_schema).clone()),
        concurrency_safe: true,
        effects: effects(tool.annotations.as_ref()),
    }
}

/// Where an MCP tool's server comes from for a call.
#[derive(Debug, Clone)]
pub(crate) enum ServerSource {
    /// Borrowed from the worker.
    Worker(WorkerServer),
    /// Started for the call, owned by the task's scope.
    Task {
        spec: Arc<ServerSpec>,
        shared: Shared,
    },
}

/// One tool of one MCP server, registered in the worker's tool registry.
#[derive(Debug)]
pub(crate) struct McpTool {
    pub server: String,
    /// The tool's name on the server.
    pub remote: String,
    pub source: ServerSource,
}

impl DynamicTool for McpTool {
    fn call<'a>(
        &'a self,
        arguments: Value,
        ctx: ToolContext<'a>,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let arguments = match arguments {
                Value::Object(map) => map,
                Value::Null => JsonObject::new(),
                _ => {
                    return Err(ToolError::InvalidArguments(format!(
                        "tool {} of mcp server {} takes a JSON object of arguments",
                        self.remote, self.server
                    )))
                }
            };
            let peer = match &self.source {
                ServerSource::Worker(server) => server.peer().await?,
                ServerSource::Task { spec, shared } => {
                    let connection = Connection::open(spec, shared).await.map_err(|e| {
                        ToolError::Unavailable(format!(
                            "mcp server {} did not start: {e}",
                            spec.name
                        ))
                    })?;
                    let peer = connection.peer().clone();
                    ctx.scope
                        .own(Box::new(connection.into_resource(&spec.name)));
                    peer
                }
            };
            call(
                &peer,
                &self.server,
                &self.remote,
                arguments,
                ctx.idempotency_key,
            )
            .await
        })
    }
}

/// Calls `tool` on `server` with the idempotency key in `_meta`.
async fn call(
    peer: &Peer<RoleClient>,
    server: &str,
    tool: &str,
    arguments: JsonObject,
    idempotency_key: &str,
) -> Result<ToolOutput, ToolError> {
    if peer.is_transport_closed() {
        return Err(ToolError::Unavailable(format!(
            "mcp server {server} is not connected"
        )));
    }
    let mut meta = MetaObject::new();
    meta.0.insert(
        IDEMPOTENCY_META_KEY.into(),
        Value::String(idempotency_key.into()),
    );
    let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
    params.meta = Some(RequestMetaObject(meta));
    match peer.call_tool(params).await {
        Ok(result) => output(result).map_err(|e| match e {
            ToolError::Failed(m) if m.starts_with(BAD_IMAGE) => {
                ToolError::Failed(format!("mcp server {server}, tool {tool}: {m}"))
            }
            other => other,
        }),
        Err(e) => Err(call_error(server, tool, e)),
    }
}

fn call_error(server: &str, tool: &str, error: ServiceError) -> ToolError {
    match error {
        ServiceError::McpError(e) if e.code == ErrorCode::INVALID_PARAMS => {
            ToolError::InvalidArguments(format!("mcp server {server}, tool {tool}: {}", e.message))
        }
        ServiceError::McpError(e) => ToolError::Failed(format!(
            "mcp server {server} refused the call of {tool}: {} (code {})",
            e.message, e.code.0
        )),
        ServiceError::TransportClosed => ToolError::Failed(format!(
            "mcp server {server} went away during the call of {tool} (it exited or closed the \
             connection); the call may or may not have taken effect"
        )),
        ServiceError::TransportSend(e) => {
            ToolError::Unavailable(format!("mcp server {server} could not be reached: {e}"))
        }
        ServiceError::Timeout { .. } => ToolError::TimedOut,
        other => ToolError::Failed(format!("mcp server {server}, tool {tool}: {other}")),
    }
}

/// What a call's result failing on an image starts with.
const BAD_IMAGE: &str = "returned an image";

/// The output of a result: text blocks joined by newlines, other blocks described briefly, the
/// structured content when there is nothing else; image blocks of a type models take also
/// become its images. `isError` makes it a failure.
pub fn output(result: CallToolResult) -> Result<ToolOutput, ToolError> {
    use base64::Engine;
    let mut images = Vec::new();
    let mut parts = Vec::with_capacity(result.content.len());
    for block in &result.content {
        let ContentBlock::Image(image) = block else {
            parts.push(describe(block));
            continue;
        };
        let size = base64_decoded_len(&image.data);
        if skein_common::protocol::content::check_media_type(&image.mime_type).is_err() {
            parts.push(format!(
                "[image: {}, {size} bytes: a type models do not take, so not shown]",
                image.mime_type
            ));
            continue;
        }
        let data = base64::engine::general_purpose::STANDARD
            .decode(image.data.trim())
            .map_err(|e| ToolError::Failed(format!("{BAD_IMAGE} that is not base64: {e}")))?;
        images.push(ToolImage {
            media_type: image.mime_type.clone(),
            data: data.into(),
        });
        parts.push(format!(
            "[image {}: {}, {size} bytes]",
            images.len(),
            image.mime_type
        ));
    }
    if parts.is_empty() {
        if let Some(structured) = &result.structured_content {
            parts.push(structured.to_string());
        }
    }
    let text = parts.join("\n");
    if result.is_error == Some(true) {
        let text = if text.is_empty() {
            "the tool reported an error without a message".to_owned()
        } else {
            text
        };
        return Err(ToolError::Failed(text));
    }
    Ok(ToolOutput { text, images })
}

fn describe(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(text) => text.text.clone(),
        ContentBlock::Image(image) => format!(
            "[image: {}, {} bytes]",
            image.mime_type,
            base64_decoded_len(&image.data)
        ),
        ContentBlock::Audio(audio) => format!(
            "[audio: {}, {} bytes]",
            audio.mime_type,
            base64_decoded_len(&audio.data)
        ),
        ContentBlock::Resource(embedded) => match &embedded.resource {
            ResourceContents::TextResourceContents { uri, text, .. } => {
                format!("[resource {uri}]\n{text}")
            }
            ResourceContents::BlobResourceContents {
                uri,
                mime_type,
                blob,
                ..
            } => format!(
                "[resource {uri}: {}, {} bytes]",
                mime_type.as_deref().unwrap_or("binary"),
                base64_decoded_len(blob)
            ),
            _ => "[resource]".to_owned(),
        },
        ContentBlock::ResourceLink(link) => {
            format!("[resource link: {} ({})]", link.uri, link.name)
        }
        _ => "[content of a kind this worker does not show]".to_owned(),
    }
}

/// Bytes encoded by a base64 string (an estimate for padding-free input).
fn base64_decoded_len(data: &str) -> usize {
    let digits = data.trim_end_matches('=').len();
    digits * 3 / 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_sanitized_and_bounded() {
        assert_eq!(tool_name("fs", "read"), Ok("mcp__fs__read".into()));
        assert_eq!(
            tool_name("fs", "read.file/v2"),
            Ok("mcp__fs__read_file_v2".into())
        );
        assert_eq!(tool_name("fs", "ünï"), Ok("mcp__fs___n_".into()));
        assert!(tool_name("fs", "").is_err());
        let long = "x".repeat(MAX_TOOL_NAME_LEN);
        let refused = tool_name("fs", &long).expect_err("too long");
        assert!(refused.contains("longer than 64"), "{refused}");
        let fits = "x".repeat(MAX_TOOL_NAME_LEN - "mcp__fs__".len());
        assert_eq!(
            tool_name("fs", &fits).map(|n| n.len()),
            Ok(MAX_TOOL_NAME_LEN)
        );
    }

    #[test]
    fn annotations_become_effects() {
        assert_eq!(effects(None), ToolEffects::default());
        let read_only = ToolAnnotations::new().read_only(true).destructive(true);
        assert_eq!(effects(Some(&read_only)), ToolEffects::READ_ONLY);
        let destructive = ToolAnnotations::new().destructive(true);
        assert!(effects(Some(&destructive)).destructive);
        let additive = ToolAnnotations::new().read_only(false).destructive(false);
        assert_eq!(effects(Some(&additive)), ToolEffects::default());
        assert_eq!(
            effects(Some(&ToolAnnotations::new())),
            ToolEffects::default()
        );
    }

    #[test]
    fn specs_carry_the_servers_schema_and_description() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"]
        });
        let Value::Object(schema_map) = schema.clone() else {
            panic!("object");
        };
        let tool = Tool::new("echo", "Echoes its text", schema_map)
            .with_annotations(ToolAnnotations::new().read_only(true));
        let spec = spec("mcp__s__echo".into(), &tool);
        assert_eq!(spec.name, "mcp__s__echo");
        assert_eq!(spec.description, "Echoes its text");
        assert_eq!(spec.parameters, schema);
        assert!(spec.effects.read_only);
    }

    #[test]
    fn results_become_text_or_failures() {
        let ok = CallToolResult::success(vec![
            ContentBlock::text("first"),
            ContentBlock::image("aGVsbG8=", "image/png"),
            ContentBlock::text("last"),
        ]);
        let shown = output(ok).expect("a result");
        assert_eq!(shown.text, "first\n[image 1: image/png, 5 bytes]\nlast");
        assert_eq!(
            shown.images,
            vec![ToolImage {
                media_type: "image/png".into(),
                data: bytes::Bytes::from_static(b"hello"),
            }]
        );
        let odd = CallToolResult::success(vec![ContentBlock::image("aGVsbG8=", "image/x-icon")]);
        let odd = output(odd).expect("a result");
        assert!(odd.images.is_empty());
        assert!(
            odd.text.contains("a type models do not take"),
            "{}",
            odd.text
        );
        let broken = CallToolResult::success(vec![ContentBlock::image("@@@", "image/png")]);
        assert!(
            matches!(output(broken), Err(ToolError::Failed(m)) if m.contains("not base64")),
            "an image that is not base64 fails the call"
        );
        let failed = CallToolResult::error(vec![ContentBlock::text("no such row")]);
        assert_eq!(output(failed), Err(ToolError::Failed("no such row".into())));
        let silent = CallToolResult::error(Vec::new());
        assert!(
            matches!(output(silent), Err(ToolError::Failed(m)) if m.contains("without a message"))
        );
        let mut structured = CallToolResult::success(Vec::new());
        structured.structured_content = Some(serde_json::json!({"n": 1}));
        assert_eq!(
            output(structured).map(|o| o.text),
            Ok("{\"n\":1}".to_owned())
        );
    }

    #[test]
    fn transport_failures_say_whether_the_call_may_have_run() {
        let gone = call_error("fx", "crash", ServiceError::TransportClosed);
        assert!(
            matches!(&gone, ToolError::Failed(m) if m.contains("went away during")),
            "{gone:?}"
        );
        let invalid = call_error(
            "fx",
            "echo",
            ServiceError::McpError(rmcp::ErrorData::invalid_params("text is required", None)),
        );
        assert!(
            matches!(&invalid, ToolError::InvalidArguments(m) if m.contains("text is required"))
        );
    }
}
