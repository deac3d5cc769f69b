//! Model providers behind one contract, [`ModelClient`]: a request (messages + tool specs) in, an
//! assistant message (text and/or tool calls) out, either whole (`complete`) or as a stream of
//! deltas (reasoning first, for thinking models, then text) ending in the whole response
//! (`stream`).
//!
//! Providers: [`openai::OpenAiClient`] (any OpenAI-compatible chat-completions server),
//! [`anthropic::AnthropicClient`] (Anthropic's Messages API) and [`scripted::ScriptedModel`]
//! (replays a scenario file; offline runs and tests). [`Provider`] picks one from configuration;
//! [`Providers`] holds several, named, and routes each call by its model's name.

pub mod anthropic;
pub mod openai;
pub mod providers;
pub mod scripted;
mod sse;
mod tool_list;

pub use providers::Providers;
pub use tool_list::ToolList;

use std::future::Future;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::StreamExt;

use crate::protocol::message::{Message, Usage};
use crate::protocol::{Failure, FailureKind, OutputSchema};

/// What a provider is asked.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    /// Model name (provider-specific).
    pub model: String,
    /// Name of the agent asking; the scripted provider picks its script by it.
    pub agent: String,
    /// The whole conversation, system prompt first. Shared: the retry layer keeps a copy of the
    /// request for another try, which costs a count, not a copy of the conversation (a layer
    /// that changes messages takes them with `Arc::make_mut`).
    pub messages: Arc<Vec<Message>>,
    /// Tools the model may call; empty means none. Shared: every turn of an agent offers the same
    /// snapshot, so no call holds a copy of its own, and its size is measured once.
    pub tools: ToolList,
    /// The most output tokens the answer may take, sent to the server (`max_tokens`, or
    /// `max_completion_tokens` where that is what the server reads); `None`
    /// leaves it to the provider's default (which Anthropic's API requires: the configured
    /// `SKEIN_MODEL_MAX_OUTPUT_TOKENS`).
    pub max_output_tokens: Option<u64>,
    /// The JSON Schema the answer must match (a structured answer), sent as the provider takes
    /// it: OpenAI-compatible servers as `response_format: json_schema`, Anthropic as a
    /// `final_answer` tool the model must call, whose input the client returns as the answer's
    /// text. The runtime checks the answer; a provider only asks for it. Shared: every call of a
    /// turn sends the same schema.
    pub output_schema: Option<Arc<OutputSchema>>,
}

/// A whole answer of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    /// The assistant message (role `assistant`), with tool calls if any.
    pub message: Message,
    pub finish_reason: Option<String>,
    pub usage: Usage,
}

/// One item of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelChunk {
    /// A piece of the answer's text.
    Delta(String),
    /// A piece of the model's reasoning (thinking models), streamed before the answer's text; the
    /// whole reasoning is also on the assembled message (`Message::reasoning`).
    Reasoning(String),
    /// The assembled response; always the last item of a successful stream.
    Done(ModelResponse),
}

/// Why a model call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("model server unreachable: {0}")]
    Unreachable(#[source] reqwest::Error),
    #[error("model call timed out after {0:?}")]
    TimedOut(std::time::Duration),
    #[error("model server answered {status}{}: {body}", retry_after_note(*.retry_after))]
    Status {
        status: u16,
        body: String,
        /// How long the server asked to wait (its `Retry-After`), with a 429 or 503.
        retry_after: Option<std::time::Duration>,
    },
    #[error("model answer could not be understood: {0}")]
    BadResponse(String),
    /// The server reported an error in place of an answer (a 200 body holding only `error`, or an
    /// `error` chunk mid-stream).
    #[error("model server reported an error: {message}")]
    ServerError { message: String, retryable: bool },
    /// The streamed answer stopped before its end (no finish reason, no `[DONE]`).
    #[error("model stream cut short: {0}")]
    Interrupted(String),
    #[error("scenario: {0}")]
    Scenario(String),
    #[error("model configuration: {0}")]
    Misconfigured(String),
    /// The request shows images this client does not send: it was configured to take none
    /// (`SKEIN_MODEL_IMAGES=false`), or an image is still a payload reference nobody read.
    /// Found before anything is sent.
    #[error("{0}")]
    ImagesRefused(String),
}

impl ModelError {
    /// The failure reported to clients.
    pub fn to_failure(&self) -> Failure {
        let (kind, retryable) = match self {
            ModelError::Status { status, body, .. }
                if matches!(status, 400 | 413 | 422) && is_context_overflow(body) =>
            {
                (FailureKind::ContextOverflow, false)
            }
            ModelError::ServerError { message, .. } if is_context_overflow(message) => {
                (FailureKind::ContextOverflow, false)
            }
            ModelError::Unreachable(_) => (FailureKind::Unavailable, true),
            ModelError::TimedOut(_) => (FailureKind::TimedOut, true),
            ModelError::Status { status, .. } => {
                (FailureKind::ModelFailed, *status == 429 || *status >= 500)
            }
            ModelError::ServerError { retryable, .. } => (FailureKind::ModelFailed, *retryable),
            ModelError::Interrupted(_) => (FailureKind::ModelFailed, true),
            ModelError::BadResponse(_) | ModelError::Scenario(_) | ModelError::Misconfigured(_) => {
                (FailureKind::ModelFailed, false)
            }
            ModelError::ImagesRefused(_) => (FailureKind::InvalidInput, false),
        };
        Failure {
            kind,
            message: self.to_string(),
            retryable,
        }
    }
}

/// Whether a server's error text says the request was longer than the model's context. Servers
/// word it differently: OpenAI's `context_length_exceeded` code ("maximum context length is ...
/// tokens"), vLLM's "maximum context length", llama.cpp's "exceeds the available context size",
/// Anthropic-style gateways' "prompt is too long", others' "reduce the length of the messages".
pub fn is_context_overflow(text: &str) -> bool {
    const SIGNS: [&str; 8] = [
        "context_length_exceeded",
        "maximum context length",
        "context length",
        "context window",
        "context size",
        "prompt is too long",
        "input is too long",
        "reduce the length",
    ];
    let text = text.to_ascii_lowercase();
    SIGNS.iter().any(|sign| text.contains(sign))
}

/// Where the server's `Retry-After` travels in a failure's message; [`retry_after`] reads it back.
const RETRY_AFTER_NOTE: &str = " (retry after ";

fn retry_after_note(retry_after: Option<std::time::Duration>) -> String {
    retry_after
        .map(|wait| format!("{RETRY_AFTER_NOTE}{} ms)", wait.as_millis()))
        .unwrap_or_default()
}

/// How long a failed model call was asked to wait before it is tried again (the server's
/// `Retry-After`, as [`ModelError::Status`] carries it into the failure's message).
pub fn retry_after(failure: &Failure) -> Option<std::time::Duration> {
    if failure.kind != FailureKind::ModelFailed {
        return None;
    }
    let (_, rest) = failure.message.split_once(RETRY_AFTER_NOTE)?;
    let (millis, _) = rest.split_once(" ms)")?;
    millis.parse().ok().map(std::time::Duration::from_millis)
}

/// How many images `request`'s messages show.
pub fn image_count(request: &ModelRequest) -> usize {
    request.messages.iter().map(|m| m.images.len()).sum()
}

/// Checks `request`'s images before `provider` sends it: refused when the client takes none
/// (`accepts` false), naming the provider and the model; refused when one is still a payload
/// reference (the cluster's runtime reads them just before the provider; a runtime without a
/// payload store cannot send stored images).
pub fn check_images(
    request: &ModelRequest,
    provider: &str,
    accepts: bool,
) -> Result<(), ModelError> {
    let count = image_count(request);
    if count == 0 {
        return Ok(());
    }
    if !accepts {
        return Err(ModelError::ImagesRefused(format!(
            "model {} of provider {provider} is configured not to take images \
             (SKEIN_MODEL_IMAGES=false), and the request shows {count}",
            request.model
        )));
    }
    let stored = request
        .messages
        .iter()
        .flat_map(|m| &m.images)
        .any(|image| matches!(image, crate::protocol::ImagePart::Payload { .. }));
    if stored {
        return Err(ModelError::ImagesRefused(format!(
            "an image stored by reference reached provider {provider} unread: this runtime has \
             no payload store to read it from"
        )));
    }
    Ok(())
}

/// A chat model.
pub trait ModelClient: Send + Sync {
    /// Asks for a whole answer.
    fn complete(
        &self,
        request: ModelRequest,
    ) -> impl Future<Output = Result<ModelResponse, ModelError>> + Send;

    /// Asks for a streamed answer: reasoning and text deltas, then [`ModelChunk::Done`].
    fn stream(
        &self,
        request: ModelRequest,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<ModelChunk, ModelError>>, ModelError>>
           + Send;
}

impl<M: ModelClient> ModelClient for Arc<M> {
    fn complete(
        &self,
        request: ModelRequest,
    ) -> impl Future<Output = Result<ModelResponse, ModelError>> + Send {
        (**self).complete(request)
    }

    fn stream(
        &self,
        request: ModelRequest,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<ModelChunk, ModelError>>, ModelError>>
           + Send {
        (**self).stream(request)
    }
}

/// The provider chosen by configuration.
#[derive(Clone)]
pub enum Provider {
    OpenAi(Arc<openai::OpenAiClient>),
    Anthropic(Arc<anthropic::AnthropicClient>),
    Scripted(Arc<scripted::ScriptedModel>),
}

impl Provider {
    /// A short label for logs and events (`openai`, `anthropic` or `scripted`).
    pub fn label(&self) -> &'static str {
        match self {
            Provider::OpenAi(_) => "openai",
            Provider::Anthropic(_) => "anthropic",
            Provider::Scripted(_) => "scripted",
        }
    }
}

impl ModelClient for Provider {
    async fn complete(&self, request: ModelRequest) -> Result<ModelResponse, ModelError> {
        match self {
            Provider::OpenAi(m) => m.complete(request).await,
            Provider::Anthropic(m) => m.complete(request).await,
            Provider::Scripted(m) => m.complete(request).await,
        }
    }

    async fn stream(
        &self,
        request: ModelRequest,
    ) -> Result<BoxStream<'static, Result<ModelChunk, ModelError>>, ModelError> {
        match self {
            Provider::OpenAi(m) => m.stream(request).await,
            Provider::Anthropic(m) => m.stream(request).await,
            Provider::Scripted(m) => m.stream(request).await,
        }
    }
}

/// Turns a whole response into a stream (for providers without native streaming).
pub fn stream_of(response: ModelResponse) -> BoxStream<'static, Result<ModelChunk, ModelError>> {
    let mut items = Vec::new();
    if let Some(reasoning) = response
        .message
        .reasoning
        .as_ref()
        .filter(|r| !r.is_empty())
    {
        items.push(Ok(ModelChunk::Reasoning(reasoning.clone())));
    }
    if !response.message.content.is_empty() {
        items.push(Ok(ModelChunk::Delta(response.message.content.clone())));
    }
    items.push(Ok(ModelChunk::Done(response)));
    futures::stream::iter(items).boxed()
}

/// The bundled example scenario, used by the scripted provider when no file is configured.
pub const BUNDLED_SCENARIO: &str = include_str!("../../../../examples/scenario.json");

impl Provider {
    /// Builds the provider configuration asks for.
    pub fn from_config(cfg: &crate::config::ModelConfig) -> Result<Self, ModelError> {
        Self::from_settings(cfg, cfg.api_key().map_err(ModelError::Misconfigured)?)
    }

    /// Builds the provider of kind `cfg.provider` with `api_key` (a named provider's key is its
    /// own, not `SKEIN_MODEL_API_KEY`).
    pub fn from_settings(
        cfg: &crate::config::ModelConfig,
        api_key: Option<String>,
    ) -> Result<Self, ModelError> {
        match cfg.provider.as_str() {
            // Azure OpenAI is the same API behind another URL and header (`openai.rs`).
            "openai" | "azure" => Ok(Provider::OpenAi(Arc::new(
                openai::OpenAiClient::configured(cfg, api_key)?,
            ))),
            // `SKEIN_MODEL_BASE_URL` defaults to OpenAI's API; left so, Anthropic's is meant.
            "anthropic" => {
                let client = anthropic::AnthropicClient::new(
                    anthropic::base_url_for(&cfg.base_url),
                    api_key,
                    cfg.timeout,
                    cfg.max_output_tokens,
                )?
                .with_images(cfg.images);
                let client = match cfg.thinking_budget {
                    0 => client,
                    budget => client.with_thinking_budget(budget)?,
                };
                Ok(Provider::Anthropic(Arc::new(client)))
            }
            "scripted" => {
                let model = match &cfg.scenario {
                    Some(path) => scripted::ScriptedModel::from_file(path)?,
                    None => scripted::ScriptedModel::from_json(BUNDLED_SCENARIO)?,
                };
                Ok(Provider::Scripted(Arc::new(model)))
            }
            other => Err(ModelError::Misconfigured(format!(
                "unknown model provider {other:?} (use \"scripted\", \"openai\", \"azure\" or \"anthropic\")"
            ))),
        }
    }

    /// The same provider sending `headers` with every request (the scripted one sends none).
    pub fn with_headers(self, headers: reqwest::header::HeaderMap) -> Result<Self, ModelError> {
        Ok(match self {
            Provider::OpenAi(client) => Provider::OpenAi(Arc::new(
                Arc::unwrap_or_clone(client).with_headers(headers)?,
            )),
            Provider::Anthropic(client) => Provider::Anthropic(Arc::new(
                Arc::unwrap_or_clone(client).with_headers(headers)?,
            )),
            scripted @ Provider::Scripted(_) => scripted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_words_for_a_request_over_the_context_are_recognised() {
        for text in [
            r#"{"error":{"code":"context_length_exceeded","message":"..."}}"#,
            "This model's maximum context length is 8192 tokens",
            "the request exceeds the available context size, try increasing it",
            "prompt is too long: 210000 tokens > 200000 maximum",
            "Please reduce the length of the messages.",
        ] {
            assert!(is_context_overflow(text), "{text}");
        }
        assert!(!is_context_overflow("invalid api key"));
        assert!(!is_context_overflow("model not found"));
    }

    #[test]
    fn an_overflow_fails_as_its_own_kind_and_is_not_retried_as_is() {
        let overflow = ModelError::Status {
            status: 400,
            body: "maximum context length is 4096 tokens".into(),
            retry_after: None,
        };
        let failure = overflow.to_failure();
        assert_eq!(failure.kind, FailureKind::ContextOverflow);
        assert!(!failure.retryable);
        let other = ModelError::Status {
            status: 400,
            body: "unknown field".into(),
            retry_after: None,
        };
        assert_eq!(other.to_failure().kind, FailureKind::ModelFailed);
    }
}
