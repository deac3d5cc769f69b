//! [`OpenAiClient`]: a client for any OpenAI-compatible chat-completions server (OpenAI, vLLM,
//! Ollama, ...) and for Azure OpenAI. This file owns the wire mapping between Skein's
//! conversation model ([`Message`], [`ToolCall`], [`ToolSpec`]) and the `/chat/completions` JSON
//! for whole answers, plus the mapping of transport failures onto [`ModelError`]; `stream` reads
//! streamed (server-sent events) answers.
//!
//! Two flavours of the same API ([`Flavour`]): an OpenAI-compatible server is posted at
//! `{base}/chat/completions` with the key as a bearer token; Azure OpenAI at
//! `{base}/openai/deployments/{deployment}/chat/completions?api-version={version}`, the
//! deployment being the request's model name, with the key in an `api-key` header (Azure's key
//! authentication; no `Authorization` header is sent).
//!
//! The answer's bound (`ModelRequest::max_output_tokens`, set by the budget layer) goes out in
//! one field, never both: some servers refuse a request that sets both. Which one is
//! [`MaxTokensField`]: `max_completion_tokens` for OpenAI's own API and Azure OpenAI (both
//! deprecate `max_tokens`, and refuse it for reasoning models), `max_tokens` for every other
//! server (the field OpenAI-compatible servers read; one that ignored `max_completion_tokens`
//! would let an answer run past its budget), unless configured otherwise.
//!
//! Timeouts: connecting is bounded by the smaller of the configured timeout and
//! [`MAX_CONNECT_TIMEOUT`]; a whole call, streamed or not, is bounded by the configured timeout
//! (a server that trickles tokens or keep-alives cannot hold a turn longer), and so is every gap
//! in a stream. A gap ends with any bytes from the server, SSE comments included: keep-alives such
//! as OpenRouter's `: OPENROUTER PROCESSING` prove the connection alive.
//!
//! Failures in place of answers: a 200 body holding only `error` surfaces the server's message
//! (retryable when its `code` is 429 or 5xx); an `error` chunk mid-stream and a stream that stops
//! before a finish reason or `[DONE]` are transient (retryable). Every failure is logged at warn.
//!
//! Servers' quirks handled here: tool-call deltas that reuse one `index` for parallel calls
//! (Ollama) are told apart by `id` — a new id at a known index starts a new call; reasoning text
//! (`reasoning_content`, DeepSeek thinking mode; `reasoning` on OpenRouter and recent vLLM) is
//! streamed as reasoning deltas, kept on the assistant message and sent back with it (as
//! `reasoning_content`); `null` usage counts are zero; reasoning tokens reported outside `completion_tokens`
//! (xAI) are added to the output count (see [`output_tokens`] for the rule).
//!
//! Caps: a response body, whole or streamed, is read up to [`MAX_RESPONSE_BYTES`]; a response
//! carries at most [`MAX_TOOL_CALLS`] tool calls. Past either the call fails as a bad response.
//!
//! Images (`openai/images.rs`): a user message that shows images sends its `content` as parts,
//! its text then one `image_url` part per image (a URL, or the bytes as a `data:` URL); a `tool`
//! message takes text only, so the images of a step's results follow its last result in one user
//! message that names the call each came from.
//!
//! A structured answer (`ModelRequest::output_schema`) is asked for as `response_format:
//! {"type": "json_schema", "json_schema": {name, description, schema, strict}}`, `strict` as the
//! schema says or, unset, when the schema keeps to what strict mode takes
//! ([`strict_compatible`]); the answer comes back as the message's text.
//!
//! Tool-call arguments arrive as JSON encoded in a string. They are decoded here; an empty string
//! becomes `{}`, and text that is not JSON is kept as a [`Value::String`] so that the caller (not
//! the model call) rejects it as invalid arguments. Arguments that are not a JSON object are sent
//! back to the server as `{}`: strict servers refuse a whole conversation over one bad call, and
//! the model learns of its mistake from the call's observation.

use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::Url;
use serde::Deserialize;
use serde_json::Value;

use super::{stream_of, ModelChunk, ModelClient, ModelError, ModelRequest, ModelResponse};
use crate::config::{ModelConfig, ENV_MODEL_BASE_URL};
use crate::protocol::message::{Message, Role, ToolCall, Usage};
use crate::protocol::{OutputSchema, ToolSpec};

mod images;
mod request;
mod stream;

use super::sse::BodyError;
use request::request_body;
pub use request::strict_compatible;
use stream::sse_answer;

/// Longest wait for a TCP/TLS connection, whatever the call timeout.
pub const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body read from a model server, whole or streamed.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;
/// Most tool calls one response may carry.
pub const MAX_TOOL_CALLS: usize = 128;
/// The Azure OpenAI `api-version` used when none is configured: the current generally available
/// version of the inference API.
pub const DEFAULT_AZURE_API_VERSION: &str = "2024-10-21";

/// Longest error body kept in [`ModelError::Status`].
const MAX_ERROR_BODY_BYTES: usize = 2048;
/// The host of OpenAI's own API.
const OPENAI_HOST: &str = "api.openai.com";

/// This client's name in logs.
const PROVIDER: &str = "openai";

/// The HTTP client of a provider whose calls may take `timeout`: connecting takes at most
/// [`MAX_CONNECT_TIMEOUT`]; `headers` go with every request.
pub(super) fn http_client(
    timeout: Duration,
    headers: HeaderMap,
) -> Result<reqwest::Client, ModelError> {
    reqwest::Client::builder()
        .connect_timeout(timeout.min(MAX_CONNECT_TIMEOUT))
        .default_headers(headers)
        .build()
        .map_err(ModelError::Unreachable)
}

/// OpenAI's own API, the base URL an `openai` provider uses unless told otherwise.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Which shape of the chat-completions API a server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// OpenAI and every OpenAI-compatible server: `{base}/chat/completions`, bearer key.
    OpenAi,
    /// Azure OpenAI: a deployment's endpoint with an `api-version`, `api-key` header.
    Azure,
}

/// The request field that carries the answer's bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxTokensField {
    /// `max_tokens`: what OpenAI-compatible servers read.
    MaxTokens,
    /// `max_completion_tokens`: what OpenAI and Azure OpenAI want (reasoning tokens included).
    MaxCompletionTokens,
}

impl MaxTokensField {
    /// The field's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
        }
    }

    /// The field a `setting` (`auto`, `max_tokens` or `max_completion_tokens`) names; `auto`
    /// picks by server: `max_completion_tokens` for Azure OpenAI and OpenAI's own API,
    /// `max_tokens` for any other.
    pub fn from_setting(setting: &str, flavour: Flavour, base_url: &str) -> Result<Self, String> {
        match setting {
            "max_tokens" => Ok(MaxTokensField::MaxTokens),
            "max_completion_tokens" => Ok(MaxTokensField::MaxCompletionTokens),
            "auto" => Ok(Self::auto(flavour, base_url)),
            other => Err(format!(
                "unknown max tokens field {other:?} (use auto, max_tokens or max_completion_tokens)"
            )),
        }
    }

    fn auto(flavour: Flavour, base_url: &str) -> Self {
        let openai = Url::parse(base_url.trim())
            .ok()
            .is_some_and(|url| url.host_str() == Some(OPENAI_HOST));
        if flavour == Flavour::Azure || openai {
            MaxTokensField::MaxCompletionTokens
        } else {
            MaxTokensField::MaxTokens
        }
    }
}

/// Where calls are posted.
#[derive(Debug, Clone)]
enum Endpoint {
    OpenAi {
        chat_url: String,
    },
    /// `root` is the resource's URL; a deployment's path is built on it per call.
    Azure {
        root: Url,
        api_version: String,
    },
}

/// A chat-completions client; cheap to share behind an `Arc`.
#[derive(Clone)]
pub struct OpenAiClient {
    http: reqwest::Client,
    endpoint: Endpoint,
    api_key: Option<String>,
    /// The key as Azure's `api-key` header (marked sensitive, so it is never printed).
    key_header: Option<HeaderValue>,
    timeout: Duration,
    max_tokens_field: MaxTokensField,
    /// Whether requests may show images; when not, one that does fails before it is sent.
    accepts_images: bool,
}

impl std::fmt::Debug for OpenAiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiClient")
            .field("endpoint", &self.endpoint)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("max_tokens_field", &self.max_tokens_field)
            .field("accepts_images", &self.accepts_images)
            .finish()
    }
}

impl OpenAiClient {
    /// A client for the OpenAI-compatible API at `base_url` (up to and including `/v1`; a
    /// trailing slash is fine), sending the answer's bound in the field [`MaxTokensField`]'s
    /// `auto` picks. A blank `api_key` counts as none.
    pub fn new(
        base_url: impl Into<String>,
        api_key: Option<String>,
        timeout: Duration,
    ) -> Result<Self, ModelError> {
        let base_url = base_url.into();
        let chat_url = format!("{}/chat/completions", base_url.trim_end_matches('/'));
        let max_tokens_field = MaxTokensField::auto(Flavour::OpenAi, &base_url);
        Self::build(
            Endpoint::OpenAi { chat_url },
            api_key,
            timeout,
            max_tokens_field,
        )
    }

    /// A client for the Azure OpenAI resource at `base_url` (`https://<resource>.openai.azure.com`;
    /// a trailing `/` or `/openai` is fine), calling each request's model as a deployment with
    /// `api_version`.
    pub fn azure(
        base_url: &str,
        api_key: Option<String>,
        timeout: Duration,
        api_version: &str,
    ) -> Result<Self, ModelError> {
        let root = azure_root(base_url, api_version).map_err(ModelError::Misconfigured)?;
        let endpoint = Endpoint::Azure {
            root,
            api_version: api_version.trim().to_owned(),
        };
        Self::build(
            endpoint,
            api_key,
            timeout,
            MaxTokensField::auto(Flavour::Azure, base_url),
        )
    }

    /// The client `cfg` configures: `azure` is Azure OpenAI, anything else an OpenAI-compatible
    /// server.
    pub fn from_config(cfg: &ModelConfig) -> Result<Self, ModelError> {
        Self::configured(cfg, cfg.api_key().map_err(ModelError::Misconfigured)?)
    }

    /// [`Self::from_config`] with `api_key` in place of the configured key.
    pub fn configured(cfg: &ModelConfig, api_key: Option<String>) -> Result<Self, ModelError> {
        let (client, flavour) = if cfg.provider == "azure" {
            let client = Self::azure(&cfg.base_url, api_key, cfg.timeout, &cfg.api_version)?;
            (client, Flavour::Azure)
        } else {
            let client = Self::new(cfg.base_url.clone(), api_key, cfg.timeout)?;
            (client, Flavour::OpenAi)
        };
        let field = MaxTokensField::from_setting(&cfg.max_tokens_field, flavour, &cfg.base_url)
            .map_err(ModelError::Misconfigured)?;
        Ok(client.with_max_tokens_field(field).with_images(cfg.images))
    }

    /// The same client, taking requests that show images (`true`, the default) or failing them
    /// before they are sent (for a model that cannot see).
    pub fn with_images(mut self, accepts: bool) -> Self {
        self.accepts_images = accepts;
        self
    }

    /// The provider's name in failures: `azure` or `openai`.
    fn provider_name(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Azure { .. } => "azure",
            Endpoint::OpenAi { .. } => "openai",
        }
    }

    /// The same client, sending `headers` with every request (beside its own).
    pub fn with_headers(mut self, headers: HeaderMap) -> Result<Self, ModelError> {
        self.http = http_client(self.timeout, headers)?;
        Ok(self)
    }

    /// The same client, sending the answer's bound as `field`.
    pub fn with_max_tokens_field(mut self, field: MaxTokensField) -> Self {
        self.max_tokens_field = field;
        self
    }

    fn build(
        endpoint: Endpoint,
        api_key: Option<String>,
        timeout: Duration,
        max_tokens_field: MaxTokensField,
    ) -> Result<Self, ModelError> {
        let api_key = api_key.filter(|key| !key.trim().is_empty());
        let key_header = match (&endpoint, &api_key) {
            (Endpoint::Azure { .. }, Some(key)) => {
                let mut value = HeaderValue::from_str(key).map_err(|_| {
                    ModelError::Misconfigured(
                        "the model API key holds characters an HTTP header cannot carry".into(),
                    )
                })?;
                value.set_sensitive(true);
                Some(value)
            }
            _ => None,
        };
        let http = http_client(timeout, HeaderMap::new())?;
        Ok(Self {
            http,
            endpoint,
            api_key,
            key_header,
            timeout,
            max_tokens_field,
            accepts_images: true,
        })
    }

    /// The endpoint a call of `model` is posted to.
    pub fn chat_url(&self, model: &str) -> String {
        match &self.endpoint {
            Endpoint::OpenAi { chat_url } => chat_url.clone(),
            Endpoint::Azure { root, api_version } => azure_chat_url(root, model, api_version),
        }
    }

    /// The field the answer's bound is sent in.
    pub fn max_tokens_field(&self) -> MaxTokensField {
        self.max_tokens_field
    }

    fn post(&self, model: &str, body: &Value) -> reqwest::RequestBuilder {
        let builder = self.http.post(self.chat_url(model)).json(body);
        match (&self.endpoint, &self.api_key, &self.key_header) {
            (Endpoint::Azure { .. }, _, Some(header)) => builder.header("api-key", header.clone()),
            // `bearer_auth` marks the header sensitive, so it is never printed.
            (Endpoint::OpenAi { .. }, Some(key), _) => builder.bearer_auth(key),
            _ => builder,
        }
    }

    fn log_call(&self, request: &ModelRequest, streamed: bool) {
        tracing::debug!(
            url = %self.chat_url(&request.model),
            model = %request.model,
            agent = %request.agent,
            messages = request.messages.len(),
            tools = request.tools.len(),
            max_output_tokens = request.max_output_tokens,
            streamed,
            "chat completion request"
        );
    }
}

/// The root URL of the Azure OpenAI resource `base_url` names (a trailing `/` or `/openai` is
/// dropped); refused when it is not an http(s) URL, is OpenAI's own API (the default base URL,
/// left unset), or `api_version` is blank.
pub fn azure_root(base_url: &str, api_version: &str) -> Result<Url, String> {
    if api_version.trim().is_empty() {
        return Err("the Azure OpenAI api-version is blank".into());
    }
    let trimmed = base_url.trim().trim_end_matches('/');
    let trimmed = trimmed.strip_suffix("/openai").unwrap_or(trimmed);
    let root = Url::parse(trimmed)
        .map_err(|e| format!("{ENV_MODEL_BASE_URL} {base_url:?} is not a URL: {e}"))?;
    if !matches!(root.scheme(), "http" | "https") || root.cannot_be_a_base() {
        return Err(format!(
            "{ENV_MODEL_BASE_URL} {base_url:?} is not an http(s) URL"
        ));
    }
    if root.host_str() == Some(OPENAI_HOST) {
        return Err(format!(
            "{ENV_MODEL_BASE_URL} must name the Azure OpenAI resource \
             (https://<resource>.openai.azure.com), not {OPENAI_HOST}"
        ));
    }
    Ok(root)
}

/// `{root}/openai/deployments/{deployment}/chat/completions?api-version={api_version}`, the
/// deployment escaped as one path segment.
fn azure_chat_url(root: &Url, deployment: &str, api_version: &str) -> String {
    let mut url = root.clone();
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty()
            .extend(["openai", "deployments", deployment, "chat", "completions"]);
    }
    url.query_pairs_mut()
        .append_pair("api-version", api_version);
    url.into()
}

impl ModelClient for OpenAiClient {
    async fn complete(&self, request: ModelRequest) -> Result<ModelResponse, ModelError> {
        let secret = self.api_key.as_deref();
        self.complete_once(request)
            .await
            .inspect_err(|e| log_failure(PROVIDER, e, secret))
    }

    async fn stream(
        &self,
        request: ModelRequest,
    ) -> Result<BoxStream<'static, Result<ModelChunk, ModelError>>, ModelError> {
        logged_stream(
            PROVIDER,
            self.open_stream(request).await,
            self.api_key.clone(),
        )
    }
}

/// Logs a failed model call of `provider` at warn, on the process that saw it: the failure's kind
/// and message, with the API key taken out (a server may echo it back in an error).
pub(super) fn log_failure(provider: &str, error: &ModelError, secret: Option<&str>) {
    let failure = error.to_failure();
    let message = match secret {
        Some(secret) if !secret.is_empty() => failure.message.replace(secret, "<redacted>"),
        _ => failure.message,
    };
    tracing::warn!(
        provider,
        kind = failure.kind.as_str(),
        retryable = failure.retryable,
        error = %message,
        "model call failed"
    );
}

/// `stream` (once opened, or the failure to open it) with its failures logged as they are read
/// ([`log_failure`]; a stream ends after its first).
pub(super) fn logged_stream(
    provider: &'static str,
    opened: Result<BoxStream<'static, Result<ModelChunk, ModelError>>, ModelError>,
    secret: Option<String>,
) -> Result<BoxStream<'static, Result<ModelChunk, ModelError>>, ModelError> {
    let stream = opened.inspect_err(|e| log_failure(provider, e, secret.as_deref()))?;
    Ok(stream
        .inspect(move |item| {
            if let Err(e) = item {
                log_failure(provider, e, secret.as_deref());
            }
        })
        .boxed())
}

impl OpenAiClient {
    async fn complete_once(&self, request: ModelRequest) -> Result<ModelResponse, ModelError> {
        super::check_images(&request, self.provider_name(), self.accepts_images)?;
        self.log_call(&request, false);
        let body = request_body(&request, false, self.max_tokens_field);
        let timeout = self.timeout;
        // The request timeout bounds the whole call, reading the body included.
        let post = self.post(&request.model, &body).timeout(timeout);
        let response = bounded(timeout, post.send()).await?;
        let response = error_for_status(response, timeout).await?;
        let bytes = read_capped(response, timeout).await?;
        parse_completion(&bytes)
    }

    async fn open_stream(
        &self,
        request: ModelRequest,
    ) -> Result<BoxStream<'static, Result<ModelChunk, ModelError>>, ModelError> {
        super::check_images(&request, self.provider_name(), self.accepts_images)?;
        self.log_call(&request, true);
        let body = request_body(&request, true, self.max_tokens_field);
        let timeout = self.timeout;
        // The whole call, the stream included, ends by this deadline; each step (the head, every
        // gap between events) is bounded by the timeout too.
        let deadline = tokio::time::Instant::now() + timeout;
        let response = bounded(timeout, self.post(&request.model, &body).send()).await?;
        let response = error_for_status(response, timeout).await?;
        if answers_with_json(&response) {
            // The server ignored `stream: true` and sent a whole answer.
            let bytes = read_capped(response, timeout).await?;
            return Ok(stream_of(parse_completion(&bytes)?));
        }
        let mut read = 0usize;
        let capped = response.bytes_stream().map(move |chunk| {
            let chunk = chunk.map_err(BodyError::Transport)?;
            read = read.saturating_add(chunk.len());
            if read > MAX_RESPONSE_BYTES {
                return Err(BodyError::TooLarge);
            }
            Ok(chunk)
        });
        Ok(sse_answer(capped.boxed(), timeout, deadline))
    }
}

// ---------------------------------------------------------------------------------------------
// Whole answers

#[derive(Debug, Deserialize)]
struct ChatCompletion {
    #[serde(default)]
    choices: Vec<CompletionChoice>,
    usage: Option<WireUsage>,
    /// Some servers and gateways answer 200 with only an error.
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct CompletionChoice {
    message: CompletionMessage,
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct CompletionMessage {
    content: Option<String>,
    reasoning_content: Option<String>,
    /// OpenRouter's and recent vLLM's name for it; read when `reasoning_content` is absent.
    reasoning: Option<String>,
    tool_calls: Option<Vec<CompletionToolCall>>,
}

#[derive(Debug, Deserialize)]
struct CompletionToolCall {
    id: Option<String>,
    function: CompletionFunction,
}

#[derive(Debug, Deserialize)]
struct CompletionFunction {
    name: String,
    /// JSON text per the API; some servers send an object instead.
    arguments: Option<Value>,
}

/// Token counts as servers report them; any of them may be absent or `null` (gateways).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    total_tokens: Option<u64>,
    completion_tokens_details: Option<WireCompletionDetails>,
    prompt_tokens_details: Option<WirePromptDetails>,
}

/// OpenAI's (and DeepSeek-style servers') count of prompt tokens served from its prompt cache.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
struct WirePromptDetails {
    cached_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
struct WireCompletionDetails {
    reasoning_tokens: Option<u64>,
}

impl From<WireUsage> for Usage {
    fn from(usage: WireUsage) -> Self {
        let prompt_tokens = usage.prompt_tokens.unwrap_or(0);
        Usage {
            prompt_tokens,
            completion_tokens: output_tokens(&usage),
            // Part of `prompt_tokens`; a server that says more is not believed past it.
            cache_read_tokens: usage
                .prompt_tokens_details
                .and_then(|details| details.cached_tokens)
                .unwrap_or(0)
                .min(prompt_tokens),
            cache_write_tokens: 0,
        }
    }
}

/// The output tokens of a call, reasoning included.
///
/// OpenAI counts `completion_tokens_details.reasoning_tokens` inside `completion_tokens`; xAI
/// (and some gateways) report them beside it. Whether they are included cannot be known in
/// general, so the rule is: reasoning tokens are added to `completion_tokens` when they exceed
/// it (they cannot be part of it then); otherwise, when `total_tokens` is reported, whatever it
/// holds beyond `prompt_tokens + completion_tokens` is added, up to `reasoning_tokens`. A server
/// that counts reasoning inside the completion is never counted twice; one that leaves it out is
/// undercounted only when its reasoning is shorter than its answer and it reports no total that
/// shows it.
fn output_tokens(usage: &WireUsage) -> u64 {
    let completion = usage.completion_tokens.unwrap_or(0);
    let reasoning = usage
        .completion_tokens_details
        .and_then(|details| details.reasoning_tokens)
        .unwrap_or(0);
    let outside = if reasoning > completion {
        reasoning
    } else {
        let counted = usage.prompt_tokens.unwrap_or(0).saturating_add(completion);
        usage
            .total_tokens
            .map_or(0, |total| total.saturating_sub(counted).min(reasoning))
    };
    completion.saturating_add(outside)
}

/// The failure a server reported in an `error` object: its message, and whether trying again may
/// help (`code` 429 or 5xx; `always_retryable` for errors that cut a stream short).
fn reported_error(error: &Value, always_retryable: bool) -> ModelError {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .map_or_else(|| error.to_string(), str::to_owned);
    let code = error.get("code").and_then(|code| {
        code.as_u64()
            .or_else(|| code.as_str().and_then(|c| c.parse().ok()))
    });
    let retryable = always_retryable || code.is_some_and(|code| code == 429 || code >= 500);
    ModelError::ServerError {
        message: crate::text::cut(&message, MAX_ERROR_BODY_BYTES),
        retryable,
    }
}

fn parse_completion(body: &[u8]) -> Result<ModelResponse, ModelError> {
    let completion: ChatCompletion = serde_json::from_slice(body).map_err(|error| {
        let start = crate::text::cut(&String::from_utf8_lossy(body), 200);
        ModelError::BadResponse(format!("{error}; the body starts with: {start}"))
    })?;
    if let (Some(error), true) = (&completion.error, completion.choices.is_empty()) {
        return Err(reported_error(error, false));
    }
    let choice = completion
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| ModelError::BadResponse("the answer has no choices".to_owned()))?;
    let tool_calls = choice
        .message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(position, call)| ToolCall {
            id: call
                .id
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| fallback_call_id(position)),
            name: call.function.name,
            arguments: decode_argument_value(call.function.arguments),
        })
        .collect();
    Ok(ModelResponse {
        message: Message {
            role: Role::Assistant,
            content: choice.message.content.unwrap_or_default(),
            tool_calls,
            tool_call_id: None,
            reasoning: choice
                .message
                .reasoning_content
                .or(choice.message.reasoning)
                .filter(|r| !r.is_empty()),
            reasoning_signature: None,
            images: Vec::new(),
        },
        finish_reason: choice.finish_reason,
        usage: completion.usage.unwrap_or_default().into(),
    })
}

/// An id for a tool call the server sent without one: unique, so calls of later steps never
/// share an id with earlier ones.
fn fallback_call_id(position: usize) -> String {
    format!(
        "call_{position}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

fn decode_argument_value(arguments: Option<Value>) -> Value {
    match arguments {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(Value::String(raw)) => decode_arguments(&raw),
        Some(already_decoded) => already_decoded,
    }
}

/// Decodes tool-call arguments sent as JSON text; see the module header for the fallbacks.
fn decode_arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(Default::default());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
}

// ---------------------------------------------------------------------------------------------
// Transport helpers

/// Reads a whole response body within `timeout`, up to [`MAX_RESPONSE_BYTES`].
pub(crate) async fn read_capped(
    mut response: reqwest::Response,
    timeout: Duration,
) -> Result<Vec<u8>, ModelError> {
    let read = async {
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| transport_error(error, timeout))?
        {
            if body.len().saturating_add(chunk.len()) > MAX_RESPONSE_BYTES {
                return Err(ModelError::BadResponse(BodyError::TooLarge.to_string()));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    };
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| ModelError::TimedOut(timeout))?
}

/// Runs one HTTP step within `timeout`, mapping its failures onto [`ModelError`].
async fn bounded<T>(
    timeout: Duration,
    step: impl std::future::Future<Output = reqwest::Result<T>>,
) -> Result<T, ModelError> {
    tokio::time::timeout(timeout, step)
        .await
        .map_err(|_| ModelError::TimedOut(timeout))?
        .map_err(|error| transport_error(error, timeout))
}

pub(crate) fn transport_error(error: reqwest::Error, timeout: Duration) -> ModelError {
    if error.is_connect() {
        ModelError::Unreachable(error)
    } else if error.is_timeout() {
        ModelError::TimedOut(timeout)
    } else if error.is_decode() {
        ModelError::BadResponse(error.to_string())
    } else {
        ModelError::Unreachable(error)
    }
}

/// Passes a 2xx response through; turns any other into [`ModelError::Status`].
async fn error_for_status(
    response: reqwest::Response,
    timeout: Duration,
) -> Result<reqwest::Response, ModelError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let retry_after = matches!(status.as_u16(), 429 | 503)
        .then(|| retry_after_seconds(response.headers()))
        .flatten();
    let body = match tokio::time::timeout(timeout, response.text()).await {
        Ok(Ok(body)) => crate::text::cut(&body, MAX_ERROR_BODY_BYTES),
        Ok(Err(error)) => format!("<body unreadable: {error}>"),
        Err(_) => "<body not received in time>".to_owned(),
    };
    tracing::debug!(status = status.as_u16(), "chat completion refused");
    Err(ModelError::Status {
        status: status.as_u16(),
        body,
        retry_after,
    })
}

/// A `Retry-After` given in seconds (the form rate limiters use); an HTTP date is not read.
fn retry_after_seconds(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

fn answers_with_json(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim_start().starts_with("application/json"))
}

#[cfg(test)]
mod tests {
    use super::request::wire_tool_call;
    use super::stream::*;
    use super::*;
    use serde_json::json;

    fn request(messages: Vec<Message>, tools: Vec<ToolSpec>) -> ModelRequest {
        ModelRequest {
            model: "m1".to_owned(),
            agent: "assistant".to_owned(),
            messages: std::sync::Arc::new(messages),
            tools: tools.into(),
            max_output_tokens: None,
            output_schema: None,
        }
    }

    fn write_file_spec() -> ToolSpec {
        ToolSpec {
            name: "write_file".to_owned(),
            description: "Writes a file.".to_owned(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            concurrency_safe: false,
            effects: Default::default(),
        }
    }

    fn absorb_all(chunks: &[Value]) -> (Vec<String>, ModelResponse) {
        let mut accumulator = StreamAccumulator::default();
        let mut texts = Vec::new();
        for chunk in chunks {
            let chunk: StreamChunk = serde_json::from_value(chunk.clone()).expect("chunk shape");
            if let Some(text) = accumulator.absorb(chunk).expect("no error chunk") {
                texts.push(text);
            }
        }
        (texts, accumulator.finish())
    }

    type SseBody = BoxStream<'static, Result<Vec<u8>, BodyError>>;

    fn events_from(raw: &str) -> SseBody {
        futures::stream::iter(vec![Ok::<_, BodyError>(raw.as_bytes().to_vec())]).boxed()
    }

    #[test]
    fn maps_messages_and_tools_into_the_request_body() {
        let assistant_call = Message {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "call_1".to_owned(),
                name: "write_file".to_owned(),
                arguments: json!({"path": "a.txt"}),
            }],
            tool_call_id: None,
            reasoning: None,
            reasoning_signature: None,
            images: Vec::new(),
        };
        let req = request(
            vec![
                Message::system("be brief"),
                Message::user("hi"),
                assistant_call,
                Message::tool_result("call_1", "ok"),
                Message::assistant("done"),
            ],
            vec![write_file_spec()],
        );
        let body = request_body(&req, false, MaxTokensField::MaxTokens);
        assert_eq!(
            body,
            json!({
                "model": "m1",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "write_file", "arguments": "{\"path\":\"a.txt\"}"}}
                    ]},
                    {"role": "tool", "content": "ok", "tool_call_id": "call_1"},
                    {"role": "assistant", "content": "done"}
                ],
                "tools": [{"type": "function", "function": {
                    "name": "write_file",
                    "description": "Writes a file.",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}
                }}],
                "stream": false
            })
        );
    }

    #[test]
    fn an_output_schema_is_asked_for_as_a_json_schema_response_format() {
        let closed = json!({
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city", "days"],
            "additionalProperties": false,
        });
        let mut req = request(vec![Message::user("where?")], vec![write_file_spec()]);
        req.output_schema = Some(std::sync::Arc::new(OutputSchema {
            name: "trip".into(),
            description: "Where and how long.".into(),
            schema: closed.clone(),
            strict: None,
        }));
        let body = request_body(&req, true, MaxTokensField::MaxTokens);
        assert_eq!(
            body["response_format"],
            json!({"type": "json_schema", "json_schema": {
                "name": "trip",
                "description": "Where and how long.",
                "schema": closed,
                "strict": true,
            }})
        );
        assert!(
            body["tools"].is_array(),
            "tools are offered beside the format"
        );

        // A schema strict mode would refuse goes without it; an explicit choice stands.
        let open = json!({"type": "object", "properties": {"city": {"type": "string"}}});
        req.output_schema = Some(std::sync::Arc::new(OutputSchema::new(open.clone())));
        let body = request_body(&req, false, MaxTokensField::MaxTokens);
        assert_eq!(
            body["response_format"]["json_schema"]["strict"],
            json!(false)
        );
        assert_eq!(
            body["response_format"]["json_schema"]["name"],
            json!("answer")
        );
        assert!(body["response_format"]["json_schema"]
            .get("description")
            .is_none());
        req.output_schema = Some(std::sync::Arc::new(OutputSchema {
            strict: Some(true),
            ..OutputSchema::new(open)
        }));
        let body = request_body(&req, false, MaxTokensField::MaxTokens);
        assert_eq!(
            body["response_format"]["json_schema"]["strict"],
            json!(true)
        );

        req.output_schema = None;
        let body = request_body(&req, false, MaxTokensField::MaxTokens);
        assert!(body.get("response_format").is_none());
    }

    #[test]
    fn strict_mode_is_asked_only_of_schemas_it_takes() {
        let closed = |properties: Value, required: Value| {
            json!({"type": "object", "properties": properties, "required": required,
                   "additionalProperties": false})
        };
        assert!(strict_compatible(&closed(json!({}), json!([]))));
        let nested = closed(
            json!({"items": {"type": "array", "items": closed(json!({"n": {"type": "number"}}), json!(["n"]))},
                   "kind": {"anyOf": [{"type": "string", "enum": ["a"]}, {"type": "null"}]}}),
            json!(["items", "kind"]),
        );
        assert!(strict_compatible(&nested));
        let with_defs = json!({
            "type": "object", "properties": {"x": {"$ref": "#/$defs/x"}}, "required": ["x"],
            "additionalProperties": false,
            "$defs": {"x": closed(json!({"y": {"type": "string"}}), json!(["y"]))},
        });
        assert!(strict_compatible(&with_defs));
        for loose in [
            json!({"type": "object", "properties": {}}),
            closed(json!({"a": {"type": "string"}}), json!([])),
            closed(
                json!({"a": {"type": "object", "properties": {}}}),
                json!(["a"]),
            ),
            closed(
                json!({"a": {"type": "string", "minLength": 2}}),
                json!(["a"]),
            ),
            closed(json!({"a": {"oneOf": [{"type": "string"}]}}), json!(["a"])),
            json!({"type": "object", "additionalProperties": false, "properties": {},
                   "$defs": {"x": {"type": "object"}}}),
        ] {
            assert!(!strict_compatible(&loose), "{loose}");
        }
    }

    #[test]
    fn streaming_body_asks_for_usage_and_omits_empty_tools() {
        let req = request(vec![Message::user("hi")], Vec::new());
        let body = request_body(&req, true, MaxTokensField::MaxTokens);
        assert_eq!(body["stream"], json!(true));
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        assert!(body.get("tools").is_none());
    }

    #[test]
    fn arguments_that_are_not_an_object_are_sent_back_as_an_empty_object() {
        for arguments in [Value::String("{broken".to_owned()), json!([1]), json!(3)] {
            let call = ToolCall {
                id: "c".to_owned(),
                name: "t".to_owned(),
                arguments,
            };
            assert_eq!(wire_tool_call(&call)["function"]["arguments"], json!("{}"));
        }
    }

    #[test]
    fn accumulates_tool_call_arguments_split_over_chunks() {
        let chunks = [
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me "}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "write."}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "call_a", "type": "function",
                 "function": {"name": "write_file", "arguments": ""}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": "{\"pa"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 1, "id": "call_b", "function": {"name": "read_file", "arguments": ""}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": "th\": \"a.txt\"}"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 1, "function": {"arguments": "not json"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 7}}),
        ];
        let (texts, response) = absorb_all(&chunks);
        assert_eq!(texts, vec!["Let me ", "write."]);
        assert_eq!(response.message.role, Role::Assistant);
        assert_eq!(response.message.content, "Let me write.");
        assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            response.usage,
            Usage {
                prompt_tokens: 12,
                completion_tokens: 7,
                ..Usage::default()
            }
        );
        assert_eq!(
            response.message.tool_calls,
            vec![
                ToolCall {
                    id: "call_a".to_owned(),
                    name: "write_file".to_owned(),
                    arguments: json!({"path": "a.txt"}),
                },
                ToolCall {
                    id: "call_b".to_owned(),
                    name: "read_file".to_owned(),
                    arguments: Value::String("not json".to_owned()),
                },
            ]
        );
    }

    #[test]
    fn tool_call_without_arguments_gets_an_empty_object() {
        let chunks = [json!({"choices": [{"delta": {"tool_calls": [
            {"index": 0, "id": "c1", "function": {"name": "list_files"}}]},
            "finish_reason": "tool_calls"}]})];
        let (_, response) = absorb_all(&chunks);
        assert_eq!(response.message.tool_calls[0].arguments, json!({}));
    }

    #[test]
    fn tool_call_deltas_without_index_continue_the_last_call() {
        let chunks = [
            json!({"choices": [{"delta": {"tool_calls": [{"id": "x", "function": {"name": "a", "arguments": "{"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"function": {"arguments": "}"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"id": "x", "function": {"arguments": ""}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"id": "y", "function": {"name": "b"}}]}}]}),
        ];
        let (_, response) = absorb_all(&chunks);
        let calls = &response.message.tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].id.as_str(), &calls[0].arguments),
            ("x", &json!({}))
        );
        assert_eq!(calls[1].name, "b");
    }

    #[test]
    fn error_chunk_fails_the_stream() {
        let chunk: StreamChunk =
            serde_json::from_value(json!({"error": {"message": "overloaded"}})).expect("shape");
        let error = StreamAccumulator::default()
            .absorb(chunk)
            .expect_err("error chunk");
        assert!(error.to_string().contains("overloaded"));
        assert!(error.to_failure().retryable, "{error:?}");
    }

    #[test]
    fn parses_a_whole_completion() {
        let body = json!({
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null,
                "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "write_file", "arguments": "{\"path\":\"n.txt\"}"}}]}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        });
        let response = parse_completion(body.to_string().as_bytes()).expect("parses");
        assert_eq!(response.message.content, "");
        assert_eq!(
            response.message.tool_calls[0].arguments,
            json!({"path": "n.txt"})
        );
        assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(response.usage.completion_tokens, 4);
    }

    #[test]
    fn undecodable_or_empty_completions_are_bad_responses() {
        assert!(matches!(
            parse_completion(b"<html>"),
            Err(ModelError::BadResponse(_))
        ));
        assert!(matches!(
            parse_completion(br#"{"choices": []}"#),
            Err(ModelError::BadResponse(_))
        ));
    }

    #[tokio::test]
    async fn sse_stream_yields_deltas_then_done() {
        let raw = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n\
                   : keep-alive\n\n\
                   data: {\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n\
                   data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n\
                   data: [DONE]\n\n";
        let items: Vec<_> = sse_answer(events_from(raw), Duration::from_secs(5), far())
            .collect()
            .await;
        assert_eq!(items.len(), 3);
        assert!(matches!(&items[0], Ok(ModelChunk::Delta(text)) if text == "Hel"));
        assert!(matches!(&items[1], Ok(ModelChunk::Delta(text)) if text == "lo"));
        let Some(Ok(ModelChunk::Done(response))) = items.last() else {
            panic!("expected Done, got {items:?}");
        };
        assert_eq!(response.message.content, "Hello");
        assert_eq!(response.usage.prompt_tokens, 5);
    }

    #[tokio::test]
    async fn sse_stream_cut_short_is_a_retryable_interruption() {
        let raw = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n";
        let items: Vec<_> = sse_answer(events_from(raw), Duration::from_secs(5), far())
            .collect()
            .await;
        let Some(Err(error)) = items.last() else {
            panic!("expected an error, got {items:?}");
        };
        assert!(matches!(error, ModelError::Interrupted(_)), "{error:?}");
        assert!(error.to_failure().retryable);
    }

    #[tokio::test]
    async fn sse_stream_ending_after_finish_reason_without_done_is_accepted() {
        let raw =
            "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\n";
        let items: Vec<_> = sse_answer(events_from(raw), Duration::from_secs(5), far())
            .collect()
            .await;
        assert!(matches!(items.last(), Some(Ok(ModelChunk::Done(_)))));
    }

    #[tokio::test]
    async fn silent_stream_times_out() {
        let silent: SseBody = futures::stream::pending().boxed();
        let items: Vec<_> = sse_answer(silent, Duration::from_millis(20), far())
            .collect()
            .await;
        assert!(matches!(items.as_slice(), [Err(ModelError::TimedOut(_))]));
    }

    /// A deadline no test reaches.
    fn far() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(3600)
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_trickles_tokens_is_cut_off_at_the_whole_call_deadline() {
        let chunk = "data: {\"choices\":[{\"delta\":{\"content\":\".\"}}]}\n\n";
        let trickle: SseBody = futures::stream::unfold((), move |()| async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Some((Ok::<_, BodyError>(chunk.as_bytes().to_vec()), ()))
        })
        .boxed();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        let items: Vec<_> = sse_answer(trickle, Duration::from_secs(1), deadline)
            .collect()
            .await;
        assert!(
            items.len() > 5,
            "it streamed before the deadline: {}",
            items.len()
        );
        assert!(
            matches!(items.last(), Some(Err(ModelError::TimedOut(_)))),
            "{:?}",
            items.last()
        );
    }

    #[tokio::test]
    async fn a_stream_over_the_body_cap_is_a_bad_response() {
        let over: SseBody =
            futures::stream::iter(vec![Err::<Vec<u8>, _>(BodyError::TooLarge)]).boxed();
        let items: Vec<_> = sse_answer(over, Duration::from_secs(5), far())
            .collect()
            .await;
        assert!(
            matches!(items.as_slice(), [Err(ModelError::BadResponse(m))] if m.contains("bytes")),
            "{items:?}"
        );
    }

    #[test]
    fn tool_call_indexes_cannot_overflow_or_grow_without_bound() {
        let delta = |index: Option<usize>, id: &str| ToolCallDelta {
            index,
            id: Some(id.to_owned()),
            function: Some(FunctionDelta {
                name: Some("f".into()),
                arguments: Some("{}".into()),
            }),
        };
        let mut acc = StreamAccumulator::default();
        acc.absorb_tool_call(delta(Some(usize::MAX), "a"))
            .expect("a call at the top index");
        // No index and a new id: the next index, which does not exist past the top.
        acc.absorb_tool_call(delta(None, "b"))
            .expect("absorbed without overflow");
        let mut many = StreamAccumulator::default();
        for i in 0..MAX_TOOL_CALLS {
            many.absorb_tool_call(delta(Some(i), "x"))
                .expect("within the cap");
        }
        let over = many.absorb_tool_call(delta(Some(MAX_TOOL_CALLS), "y"));
        assert!(matches!(over, Err(ModelError::BadResponse(_))), "{over:?}");
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Any bytes, cut anywhere, through the SSE parser and the accumulator: no panic, and
        /// the stream always ends — with an answer or an error, which is last.
        #[test]
        fn the_sse_parser_survives_any_bytes_cut_anywhere(
            pieces in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
                    "(data: )?\\{\"choices\":\\[\\{\"index\":[0-9]{1,20},\"delta\":\\{\"tool_calls\":\\[\\{\"index\":[0-9]{1,20},\"id\":\"[a-z]{0,3}\",\"function\":\\{\"arguments\":\"[a-z{}]{0,5}\"\\}\\}\\]\\}(,\"finish_reason\":\"stop\")?\\}\\]\\}\n\n"
                        .prop_map(String::into_bytes),
                    proptest::strategy::Just(b"data: [DONE]\n\n".to_vec()),
                ],
                0..12,
            )
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a runtime");
            let events: SseBody =
                futures::stream::iter(pieces.into_iter().map(Ok::<_, BodyError>)).boxed();
            let items: Vec<_> = runtime
                .block_on(sse_answer(events, Duration::from_secs(5), far()).collect());
            let ended = matches!(items.last(), Some(Ok(ModelChunk::Done(_))) | Some(Err(_)));
            proptest::prop_assert!(ended, "{items:?}");
            let errors = items.iter().filter(|item| item.is_err()).count();
            proptest::prop_assert!(errors <= 1);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Answers in real servers' shapes (fixtures/), written from their public documentation and
    // issue threads, not recorded: each names its source (fixtures/README.md).

    /// Every fixture says where its shape comes from: an SSE one in its first line (a comment,
    /// which SSE readers skip), a JSON one in the folder's README.
    #[test]
    fn every_fixture_names_its_source() {
        let folder =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/agent/model/fixtures");
        let readme = std::fs::read_to_string(folder.join("README.md")).expect("fixtures/README.md");
        let mut seen = 0;
        for entry in std::fs::read_dir(&folder).expect("the fixtures folder") {
            let path = entry.expect("an entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .expect("a name")
                .to_owned();
            let text = std::fs::read_to_string(&path).expect("a fixture reads");
            if name.ends_with(".sse") {
                let first = text.lines().next().unwrap_or_default();
                assert!(
                    first.starts_with(": ") && first.contains("recorded"),
                    "{name} does not name its source in its first line: {first:?}"
                );
                seen += 1;
            } else if name.ends_with(".json") {
                assert!(
                    readme.contains(&format!("`{name}`")),
                    "{name} is not in the README"
                );
                seen += 1;
            }
        }
        assert!(seen >= 9, "found the fixtures: {seen}");
    }

    /// The SSE body of a fixture, cut into its events, each a separate read.
    fn fixture_pieces(raw: &str) -> Vec<Vec<u8>> {
        raw.split_inclusive("\n\n")
            .map(|piece| piece.as_bytes().to_vec())
            .collect()
    }

    async fn stream_fixture(raw: &str) -> Vec<Result<ModelChunk, ModelError>> {
        let body: SseBody =
            futures::stream::iter(fixture_pieces(raw).into_iter().map(Ok::<_, BodyError>)).boxed();
        sse_answer(body, Duration::from_secs(5), far())
            .collect()
            .await
    }

    fn done_of(items: &[Result<ModelChunk, ModelError>]) -> &ModelResponse {
        match items.last() {
            Some(Ok(ModelChunk::Done(response))) => response,
            other => panic!("expected Done, got {other:?}"),
        }
    }

    // Ollama 0.20.x, shape as shown in github.com/ollama/ollama/issues/15457 (every call at index 0).
    const OLLAMA_PARALLEL_CALLS: &str = include_str!("fixtures/ollama_parallel_tool_calls.sse");

    #[tokio::test]
    async fn ollama_parallel_calls_sharing_index_zero_are_told_apart_by_id() {
        let items = stream_fixture(OLLAMA_PARALLEL_CALLS).await;
        let calls = &done_of(&items).message.tool_calls;
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(calls[0].id, "call_9x2kq1ma");
        assert_eq!(
            calls[0].arguments,
            json!({"content": "print(\"hello\")", "filePath": "hello.py"})
        );
        assert_eq!(calls[1].id, "call_k3v8d0wz");
        assert_eq!(calls[1].arguments["filePath"], json!("world.py"));
    }

    // DeepSeek thinking mode, delta shape per api-docs.deepseek.com/guides/thinking_mode
    // (`reasoning_content` beside `content`, to be sent back after tool calls).
    const DEEPSEEK_THINKING: &str = include_str!("fixtures/deepseek_thinking_stream.sse");

    #[tokio::test]
    async fn deepseek_reasoning_is_kept_on_the_message_and_sent_back() {
        let items = stream_fixture(DEEPSEEK_THINKING).await;
        let texts: Vec<_> = items
            .iter()
            .filter_map(|item| match item {
                Ok(ModelChunk::Delta(text)) => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(
            texts,
            vec!["9.8 is greater."],
            "reasoning is not answer text"
        );
        let response = done_of(&items);
        assert_eq!(
            response.message.reasoning.as_deref(),
            Some("Compare 9.11 and 9.8: 0.8 > 0.11.")
        );
        // DeepSeek counts reasoning inside completion_tokens (34 of 40): not counted twice.
        assert_eq!(response.usage.completion_tokens, 40);
        let req = request(
            vec![Message::user("which is greater?"), response.message.clone()],
            Vec::new(),
        );
        let body = request_body(&req, true, MaxTokensField::MaxTokens);
        assert_eq!(
            body["messages"][1]["reasoning_content"],
            json!("Compare 9.11 and 9.8: 0.8 > 0.11.")
        );
        assert!(body["messages"][0].get("reasoning_content").is_none());
    }

    #[tokio::test]
    async fn deepseek_reasoning_streams_as_reasoning_deltas_before_the_answer() {
        let items = stream_fixture(DEEPSEEK_THINKING).await;
        let pieces: Vec<_> = items
            .iter()
            .filter_map(|item| match item {
                Ok(ModelChunk::Reasoning(text)) => Some(("reasoning", text.as_str())),
                Ok(ModelChunk::Delta(text)) => Some(("text", text.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(
            pieces,
            vec![
                ("reasoning", "Compare 9.11 and 9.8: "),
                ("reasoning", "0.8 > 0.11."),
                ("text", "9.8 is greater."),
            ]
        );
        assert!(matches!(items.last(), Some(Ok(ModelChunk::Done(_)))));
    }

    // OpenRouter reasoning tokens, delta shape per openrouter.ai/docs/use-cases/reasoning-tokens
    // (`reasoning` and `reasoning_details` beside `content`; recent vLLM also names it
    // `reasoning`).
    const OPENROUTER_REASONING: &str = include_str!("fixtures/openrouter_reasoning_stream.sse");

    #[tokio::test]
    async fn openrouter_reasoning_is_streamed_kept_and_sent_back_as_reasoning_content() {
        let items = stream_fixture(OPENROUTER_REASONING).await;
        let pieces: Vec<_> = items
            .iter()
            .filter_map(|item| match item {
                Ok(ModelChunk::Reasoning(text)) => Some(("reasoning", text.as_str())),
                Ok(ModelChunk::Delta(text)) => Some(("text", text.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(
            pieces,
            vec![
                ("reasoning", "The user wants a prime. "),
                ("reasoning", "7 has no divisors but 1 and 7."),
                ("text", "7"),
                ("text", " is prime."),
            ]
        );
        let response = done_of(&items);
        assert_eq!(response.message.content, "7 is prime.");
        assert_eq!(
            response.message.reasoning.as_deref(),
            Some("The user wants a prime. 7 has no divisors but 1 and 7.")
        );
        let req = request(
            vec![Message::user("a prime?"), response.message.clone()],
            Vec::new(),
        );
        assert_eq!(
            request_body(&req, true, MaxTokensField::MaxTokens)["messages"][1]["reasoning_content"],
            json!("The user wants a prime. 7 has no divisors but 1 and 7.")
        );
    }

    #[test]
    fn a_delta_with_both_reasoning_names_counts_its_reasoning_once() {
        let mut accumulator = StreamAccumulator::default();
        let chunk = serde_json::from_value(json!({"choices": [{"index": 0, "delta": {
            "reasoning_content": "think", "reasoning": "think", "content": "answer"
        }}]}))
        .expect("a chunk");
        assert_eq!(
            accumulator.absorb(chunk).expect("absorbed").as_deref(),
            Some("answer")
        );
        assert_eq!(accumulator.take_reasoning(), "think");
        assert_eq!(accumulator.take_reasoning(), "");
        assert_eq!(
            accumulator.finish().message.reasoning.as_deref(),
            Some("think")
        );
    }

    #[tokio::test]
    async fn a_chunk_with_reasoning_and_text_gives_its_reasoning_first() {
        let raw = "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"r\",\"content\":\"t\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        let items = stream_fixture(raw).await;
        assert!(
            matches!(
                items.as_slice(),
                [
                    Ok(ModelChunk::Reasoning(r)),
                    Ok(ModelChunk::Delta(t)),
                    Ok(ModelChunk::Done(_))
                ] if r == "r" && t == "t"
            ),
            "{items:?}"
        );
    }

    // OpenRouter keep-alive comments, documented at openrouter.ai/docs/api-reference/streaming.
    const OPENROUTER_KEEPALIVE: &str = include_str!("fixtures/openrouter_keepalive.sse");

    /// The fixture's events, `gap` apart, forever when `repeat_first` (a server that only ever
    /// sends its first piece).
    fn paced(raw: &str, gap: Duration, repeat_first: bool) -> SseBody {
        let pieces = fixture_pieces(raw);
        futures::stream::unfold(0usize, move |at| {
            let piece = if repeat_first {
                pieces.first().cloned()
            } else {
                pieces.get(at).cloned()
            };
            async move {
                tokio::time::sleep(gap).await;
                piece.map(|piece| (Ok::<_, BodyError>(piece), at + 1))
            }
        })
        .boxed()
    }

    #[tokio::test(start_paused = true)]
    async fn keep_alive_comments_count_as_activity_for_the_idle_timeout() {
        // Five comments 400 ms apart: 2 s without an event, with an idle timeout of 1 s.
        let body = paced(OPENROUTER_KEEPALIVE, Duration::from_millis(400), false);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let items: Vec<_> = sse_answer(body, Duration::from_secs(1), deadline)
            .collect()
            .await;
        assert_eq!(done_of(&items).message.content, "Done.");
    }

    #[tokio::test(start_paused = true)]
    async fn keep_alives_alone_do_not_outlast_the_whole_call_deadline() {
        let body = paced(OPENROUTER_KEEPALIVE, Duration::from_millis(400), true);
        let started = tokio::time::Instant::now();
        let deadline = started + Duration::from_secs(5);
        let items: Vec<_> = sse_answer(body, Duration::from_secs(1), deadline)
            .collect()
            .await;
        assert!(
            matches!(items.as_slice(), [Err(ModelError::TimedOut(_))]),
            "{items:?}"
        );
        assert!(tokio::time::Instant::now() >= deadline);
    }

    // OpenRouter mid-stream error, shape per openrouter.ai/docs/api-reference/streaming
    // ("Handling Errors During Streaming").
    const OPENROUTER_MIDSTREAM_ERROR: &str =
        include_str!("fixtures/openrouter_midstream_error.sse");

    #[tokio::test]
    async fn a_mid_stream_error_chunk_is_a_retryable_failure_not_an_answer() {
        let items = stream_fixture(OPENROUTER_MIDSTREAM_ERROR).await;
        let Some(Err(error)) = items.last() else {
            panic!("expected an error, got {items:?}");
        };
        assert!(
            error
                .to_string()
                .contains("Provider disconnected unexpectedly"),
            "{error}"
        );
        assert!(error.to_failure().retryable);
    }

    // OpenRouter error body (`{"error": {"code", "message", "metadata"}}`), sent with status 200
    // once the model started, per openrouter.ai/docs/api-reference/errors-and-debugging.
    const OPENROUTER_ERROR_200: &str = include_str!("fixtures/openrouter_error_200.json");

    #[test]
    fn a_200_body_holding_only_an_error_surfaces_the_servers_message() {
        let error = parse_completion(OPENROUTER_ERROR_200.as_bytes()).expect_err("no answer");
        assert!(
            matches!(&error, ModelError::ServerError { message, retryable: true }
                if message == "Provider returned error"),
            "{error:?}"
        );
        let client_error = parse_completion(br#"{"error": {"code": 400, "message": "bad"}}"#)
            .expect_err("no answer");
        assert!(!client_error.to_failure().retryable);
    }

    // xAI grok-4.1-fast-reasoning usage, from the example response in
    // docs.cloud.google.com/vertex-ai/generative-ai/docs/partner-models/grok/capabilities/reasoning.
    const XAI_ANSWER: &str = include_str!("fixtures/xai_usage.json");
    // vLLM usage with null detail fields, as logged in github.com/BerriAI/litellm/issues/22984.
    const VLLM_NULL_USAGE: &str = include_str!("fixtures/vllm_null_usage_details.json");
    // Gemini 2.5 Flash via LiteLLM 1.70.1, as logged in github.com/BerriAI/litellm/issues/10667.
    const GEMINI_LITELLM_USAGE: &str = include_str!("fixtures/gemini_litellm_usage.json");

    fn usage_of(raw: &str) -> Usage {
        serde_json::from_str::<WireUsage>(raw)
            .expect("usage shape")
            .into()
    }

    #[test]
    fn reasoning_tokens_reported_outside_the_completion_are_counted() {
        let response = parse_completion(XAI_ANSWER.as_bytes()).expect("parses");
        assert_eq!(response.usage.completion_tokens, 50 + 124);
        assert_eq!(usage_of(GEMINI_LITELLM_USAGE).completion_tokens, 774 + 1175);
        // A total beyond prompt + completion shows reasoning left out, even when it is short.
        let xai_with_total = r#"{"prompt_tokens": 10, "completion_tokens": 50, "total_tokens": 90,
            "completion_tokens_details": {"reasoning_tokens": 30}}"#;
        assert_eq!(usage_of(xai_with_total).completion_tokens, 80);
    }

    #[test]
    fn reasoning_tokens_inside_the_completion_and_null_counts_are_not_counted_twice() {
        let usage = usage_of(VLLM_NULL_USAGE);
        assert_eq!(
            usage,
            Usage {
                prompt_tokens: 150_383,
                completion_tokens: 304,
                // Its `prompt_tokens_details.cached_tokens`.
                cache_read_tokens: 149_936,
                cache_write_tokens: 0,
            }
        );
        let nulls = r#"{"prompt_tokens": null, "completion_tokens": null, "total_tokens": null,
            "completion_tokens_details": null}"#;
        assert_eq!(usage_of(nulls), Usage::default());
    }

    #[test]
    fn prompt_tokens_served_from_the_cache_are_counted_as_cache_reads() {
        let openai = r#"{"prompt_tokens": 2006, "completion_tokens": 300,
            "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0}}"#;
        let usage = usage_of(openai);
        assert_eq!(
            (
                usage.prompt_tokens,
                usage.cache_read_tokens,
                usage.cache_write_tokens
            ),
            (2006, 1920, 0)
        );
        let nonsense = r#"{"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 99}}"#;
        assert_eq!(usage_of(nonsense).cache_read_tokens, 10);
        let null = r#"{"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": null}}"#;
        assert_eq!(usage_of(null).cache_read_tokens, 0);
    }

    #[test]
    fn debug_output_redacts_the_key_and_base_url_tolerates_a_slash() {
        let client = OpenAiClient::new(
            "http://localhost:8000/v1/",
            Some("sk-secret".to_owned()),
            Duration::from_secs(3),
        )
        .expect("client builds");
        let printed = format!("{client:?}");
        assert!(!printed.contains("sk-secret"));
        assert!(printed.contains("<redacted>"));
        assert_eq!(
            client.chat_url("any-model"),
            "http://localhost:8000/v1/chat/completions"
        );
    }

    #[test]
    fn the_answer_bound_goes_out_in_one_field_and_only_when_set() {
        let mut req = request(vec![Message::user("hi")], Vec::new());
        for field in [
            MaxTokensField::MaxTokens,
            MaxTokensField::MaxCompletionTokens,
        ] {
            let body = request_body(&req, true, field);
            assert!(body.get("max_tokens").is_none(), "{body}");
            assert!(body.get("max_completion_tokens").is_none(), "{body}");
        }
        req.max_output_tokens = Some(300);
        let body = request_body(&req, false, MaxTokensField::MaxTokens);
        assert_eq!(body["max_tokens"], json!(300));
        assert!(body.get("max_completion_tokens").is_none(), "{body}");
        let body = request_body(&req, true, MaxTokensField::MaxCompletionTokens);
        assert_eq!(body["max_completion_tokens"], json!(300));
        assert!(body.get("max_tokens").is_none(), "{body}");
    }

    #[test]
    fn the_bound_field_is_max_completion_tokens_for_openai_and_azure_and_max_tokens_elsewhere() {
        use MaxTokensField::{MaxCompletionTokens, MaxTokens};
        // (setting, flavour, base URL, field)
        let cases = [
            (
                "auto",
                Flavour::OpenAi,
                "https://api.openai.com/v1",
                MaxCompletionTokens,
            ),
            (
                "auto",
                Flavour::OpenAi,
                "https://api.openai.com/v1/",
                MaxCompletionTokens,
            ),
            (
                "auto",
                Flavour::Azure,
                "https://acme.openai.azure.com",
                MaxCompletionTokens,
            ),
            (
                "auto",
                Flavour::OpenAi,
                "http://localhost:11434/v1",
                MaxTokens,
            ),
            (
                "auto",
                Flavour::OpenAi,
                "https://openrouter.ai/api/v1",
                MaxTokens,
            ),
            (
                "auto",
                Flavour::OpenAi,
                "https://api.openai.com.example/v1",
                MaxTokens,
            ),
            ("auto", Flavour::OpenAi, "not a url", MaxTokens),
            (
                "max_tokens",
                Flavour::Azure,
                "https://acme.openai.azure.com",
                MaxTokens,
            ),
            (
                "max_completion_tokens",
                Flavour::OpenAi,
                "http://vllm:8000/v1",
                MaxCompletionTokens,
            ),
        ];
        for (setting, flavour, base, field) in cases {
            assert_eq!(
                MaxTokensField::from_setting(setting, flavour, base),
                Ok(field),
                "{setting} {flavour:?} {base}"
            );
        }
        let unknown = MaxTokensField::from_setting("max_output_tokens", Flavour::OpenAi, "x")
            .expect_err("an unknown field");
        assert!(unknown.contains("max_output_tokens"), "{unknown}");
        let client = OpenAiClient::new("http://127.0.0.1:1/v1", None, Duration::from_secs(1))
            .expect("client builds");
        assert_eq!(client.max_tokens_field(), MaxTokens);
        let client = client.with_max_tokens_field(MaxCompletionTokens);
        assert_eq!(client.max_tokens_field(), MaxCompletionTokens);
    }

    #[test]
    fn azure_calls_the_models_deployment_with_the_api_version() {
        for base in [
            "https://acme.openai.azure.com",
            "https://acme.openai.azure.com/",
            "https://acme.openai.azure.com/openai",
            " https://acme.openai.azure.com/openai/ ",
        ] {
            let client = OpenAiClient::azure(
                base,
                Some("azure-key-123".into()),
                Duration::from_secs(3),
                "2024-10-21",
            )
            .expect("client builds");
            assert_eq!(
                client.chat_url("gpt-4o-prod"),
                "https://acme.openai.azure.com/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21",
                "{base}"
            );
            assert_eq!(
                client.max_tokens_field(),
                MaxTokensField::MaxCompletionTokens
            );
            let printed = format!("{client:?}");
            assert!(!printed.contains("azure-key-123"), "{printed}");
        }
        // A gateway under a path keeps it; a deployment name is one escaped path segment.
        let client = OpenAiClient::azure(
            "http://127.0.0.1:9/proxy",
            None,
            Duration::from_secs(3),
            "2025-04-01-preview",
        )
        .expect("client builds");
        assert_eq!(
            client.chat_url("team/model"),
            "http://127.0.0.1:9/proxy/openai/deployments/team%2Fmodel/chat/completions?api-version=2025-04-01-preview"
        );
    }

    #[test]
    fn an_azure_endpoint_must_be_a_resource_url_with_an_api_version() {
        for (base, version, says) in [
            (
                "https://api.openai.com/v1",
                "2024-10-21",
                "must name the Azure OpenAI resource",
            ),
            ("acme.openai.azure.com", "2024-10-21", "is not a URL"),
            (
                "ftp://acme.openai.azure.com",
                "2024-10-21",
                "is not an http(s) URL",
            ),
            ("https://acme.openai.azure.com", " ", "api-version is blank"),
        ] {
            let refused = azure_root(base, version).expect_err(base);
            assert!(refused.contains(says), "{base}: {refused}");
            let error =
                OpenAiClient::azure(base, None, Duration::from_secs(1), version).expect_err(base);
            assert!(matches!(error, ModelError::Misconfigured(_)), "{error:?}");
        }
        let bad_key = OpenAiClient::azure(
            "https://acme.openai.azure.com",
            Some("line\nbreak-key".into()),
            Duration::from_secs(1),
            "2024-10-21",
        );
        assert!(
            matches!(bad_key, Err(ModelError::Misconfigured(_))),
            "{bad_key:?}"
        );
    }

    #[test]
    fn truncation_respects_char_boundaries_and_the_limit() {
        let long = "é".repeat(3000);
        let cut = crate::text::cut(&long, MAX_ERROR_BODY_BYTES);
        assert!(cut.len() <= MAX_ERROR_BODY_BYTES);
        assert!(cut.ends_with('…'));
        assert_eq!(crate::text::cut("short", 10), "short");
    }
}
