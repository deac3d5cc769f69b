//! [`AnthropicClient`]: a native client for Anthropic's Messages API (`POST {base}/v1/messages`,
//! always streamed). This module owns the client and its calls; `request` maps Skein's
//! conversation onto the API's content blocks, `stream` reads the streamed events into deltas and
//! one assembled response, `http` bounds and maps the HTTP steps.
//!
//! Wire: headers `x-api-key` (marked sensitive, never printed; left out when no key is set, for a
//! gateway that adds its own), `anthropic-version: 2023-06-01` and `content-type:
//! application/json`. `max_tokens` (which the API requires) is the request's
//! `max_output_tokens`, or else the configured `SKEIN_MODEL_MAX_OUTPUT_TOKENS`.
//!
//! Base URL: `https://api.anthropic.com` ([`DEFAULT_BASE_URL`]) unless another is configured;
//! `SKEIN_MODEL_BASE_URL`'s own default (OpenAI's API) counts as not configured
//! ([`base_url_for`]). A base URL that already ends in `/v1` is not given a second one.
//!
//! Timeouts, caps and failures are the OpenAI-compatible client's: connecting within the
//! smaller of the call timeout and [`MAX_CONNECT_TIMEOUT`](super::openai::MAX_CONNECT_TIMEOUT); the whole call, stream included,
//! within `SKEIN_MODEL_TIMEOUT`, and so is every gap between events (any bytes count as
//! activity); a body read up to [`MAX_RESPONSE_BYTES`], at most
//! [`MAX_TOOL_CALLS`](super::openai::MAX_TOOL_CALLS) tool calls.
//! `complete` reads the same stream to its end: the API advises streaming for long answers, and
//! one code path reads both. A server that answers `stream: true` with a whole JSON message is
//! read as one. Every failure is logged at warn, the key taken out.
//!
//! Thinking: a thinking block the model returns is kept on the assistant message (its text as
//! `Message::reasoning`, its signature as `Message::reasoning_signature`) and sent back as the
//! message's first block, as the API requires within a turn that calls tools. The signature
//! covers the text as the model wrote it: thinking changed since (a secret masked in it by the
//! redaction layer) is refused by the API. Asking for thinking is off unless
//! [`AnthropicClient::with_thinking_budget`] sets a budget (`SKEIN_MODEL_THINKING_BUDGET`, or a
//! named provider's `thinking_budget`).
//!
//! Structured answers: the output schema is offered as the [`ANSWER_TOOL`] tool, which the
//! model must call (`tool_choice`; only asked for, not forced, while it thinks, which the API
//! requires), and whose call comes back as the answer's text (see `request` and `stream`).

mod http;
mod request;
mod stream;

#[cfg(test)]
mod tests;

use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::Value;

use super::openai::logged_stream;
use super::openai::{http_client, MAX_RESPONSE_BYTES};
use super::{stream_of, ModelChunk, ModelClient, ModelError, ModelRequest, ModelResponse};
use http::{answers_with_json, bounded, error_for_status, read_capped};
use stream::{parse_whole, sse_answer, BodyError};

pub use request::{ANSWER_TOOL, ANSWER_TOOL_INSTRUCTION, MIN_THINKING_BUDGET};

/// Where Anthropic's API is, when no other base URL is configured.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The API version every request names (`anthropic-version`).
pub const API_VERSION: &str = "2023-06-01";

/// The base URL to use for a configured `SKEIN_MODEL_BASE_URL`: [`DEFAULT_BASE_URL`] when it is
/// blank or OpenAI's API (the setting's default, which no one points this provider at), else
/// the configured one.
pub fn base_url_for(configured: &str) -> &str {
    let trimmed = configured.trim();
    let host = trimmed
        .strip_prefix("https://")
        .or_else(|| trimmed.strip_prefix("http://"))
        .unwrap_or(trimmed);
    let host = host.split(['/', ':']).next().unwrap_or_default();
    if trimmed.is_empty() || host.eq_ignore_ascii_case("api.openai.com") {
        DEFAULT_BASE_URL
    } else {
        configured
    }
}

/// A Messages API client; cheap to share behind an `Arc`.
#[derive(Clone)]
pub struct AnthropicClient {
    http: reqwest::Client,
    messages_url: String,
    api_key: Option<reqwest::header::HeaderValue>,
    /// The key's text, only to take it out of logged failures.
    secret: Option<String>,
    timeout: Duration,
    max_output_tokens: u64,
    thinking_budget: Option<u64>,
    /// Whether requests may show images; when not, one that does fails before it is sent.
    accepts_images: bool,
}

impl std::fmt::Debug for AnthropicClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicClient")
            .field("messages_url", &self.messages_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("max_output_tokens", &self.max_output_tokens)
            .field("thinking_budget", &self.thinking_budget)
            .field("accepts_images", &self.accepts_images)
            .finish()
    }
}

impl AnthropicClient {
    /// The same client, sending `headers` with every request (beside its own).
    pub fn with_headers(mut self, headers: reqwest::header::HeaderMap) -> Result<Self, ModelError> {
        self.http = http_client(self.timeout, headers)?;
        Ok(self)
    }

    /// A client for the API at `base_url` (`https://api.anthropic.com`, with or without `/v1`; a
    /// trailing slash is fine), answering in at most `max_output_tokens` unless a request says
    /// otherwise. A blank `api_key` counts as none.
    pub fn new(
        base_url: impl Into<String>,
        api_key: Option<String>,
        timeout: Duration,
        max_output_tokens: u64,
    ) -> Result<Self, ModelError> {
        if max_output_tokens == 0 {
            return Err(ModelError::Misconfigured(
                "the Anthropic API needs a positive max_tokens (SKEIN_MODEL_MAX_OUTPUT_TOKENS)"
                    .to_owned(),
            ));
        }
        let secret = api_key.filter(|key| !key.trim().is_empty());
        let api_key = secret
            .as_deref()
            .map(|key| {
                let mut value =
                    reqwest::header::HeaderValue::from_str(key.trim()).map_err(|_| {
                        ModelError::Misconfigured(
                            "the model API key holds characters a header cannot carry".to_owned(),
                        )
                    })?;
                value.set_sensitive(true);
                Ok::<_, ModelError>(value)
            })
            .transpose()?;
        let http = http_client(timeout, reqwest::header::HeaderMap::new())?;
        Ok(Self {
            http,
            messages_url: messages_url(&base_url.into()),
            api_key,
            secret,
            timeout,
            max_output_tokens,
            thinking_budget: None,
            accepts_images: true,
        })
    }

    /// The same client, taking requests that show images (`true`, the default) or failing them
    /// before they are sent (for a model that cannot see).
    pub fn with_images(mut self, accepts: bool) -> Self {
        self.accepts_images = accepts;
        self
    }

    /// Asks the model to think first, within `budget_tokens` (at least
    /// [`MIN_THINKING_BUDGET`], and under the most output tokens, which the thinking counts
    /// in). A call allowed fewer output tokens than the budget thinks within what it may
    /// spend, or not at all when that is under the minimum.
    pub fn with_thinking_budget(mut self, budget_tokens: u64) -> Result<Self, ModelError> {
        if budget_tokens < MIN_THINKING_BUDGET || budget_tokens >= self.max_output_tokens {
            return Err(ModelError::Misconfigured(format!(
                "a thinking budget must be at least {MIN_THINKING_BUDGET} tokens and under the \
                 most output tokens ({}), not {budget_tokens}",
                self.max_output_tokens
            )));
        }
        self.thinking_budget = Some(budget_tokens);
        Ok(self)
    }

    /// The endpoint every call is posted to.
    pub fn messages_url(&self) -> &str {
        &self.messages_url
    }

    /// The body of the call asking for `request` (what [`ModelClient::stream`] posts).
    pub fn request_body(&self, request: &ModelRequest) -> Value {
        let max_tokens = request
            .max_output_tokens
            .filter(|&tokens| tokens > 0)
            .unwrap_or(self.max_output_tokens);
        request::request_body(request, max_tokens, self.thinking_budget)
    }

    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let builder = self
            .http
            .post(&self.messages_url)
            .header("anthropic-version", API_VERSION)
            .json(body);
        match &self.api_key {
            Some(key) => builder.header("x-api-key", key.clone()),
            None => builder,
        }
    }

    async fn open_stream(
        &self,
        request: ModelRequest,
    ) -> Result<BoxStream<'static, Result<ModelChunk, ModelError>>, ModelError> {
        super::check_images(&request, "anthropic", self.accepts_images)?;
        tracing::debug!(
            url = %self.messages_url,
            model = %request.model,
            agent = %request.agent,
            messages = request.messages.len(),
            tools = request.tools.len(),
            "messages request"
        );
        let body = self.request_body(&request);
        let structured = request.output_schema.is_some();
        let timeout = self.timeout;
        // The whole call, the stream included, ends by this deadline; each step (the head, every
        // gap between events) is bounded by the timeout too.
        let deadline = tokio::time::Instant::now() + timeout;
        let response = bounded(timeout, self.post(&body).send()).await?;
        let response = error_for_status(response, timeout).await?;
        if answers_with_json(&response) {
            let bytes = read_capped(response, timeout).await?;
            return Ok(stream_of(parse_whole(&bytes, structured)?));
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
        Ok(sse_answer(capped.boxed(), timeout, deadline, structured))
    }
}

/// This client's name in logs.
const PROVIDER: &str = "anthropic";

impl ModelClient for AnthropicClient {
    async fn complete(&self, request: ModelRequest) -> Result<ModelResponse, ModelError> {
        let mut stream = self.stream(request).await?;
        // Failures inside the stream are logged by `stream` as they are read.
        while let Some(item) = stream.next().await {
            if let ModelChunk::Done(response) = item? {
                return Ok(response);
            }
        }
        Err(ModelError::Interrupted(
            "the stream ended without a response".to_owned(),
        ))
    }

    async fn stream(
        &self,
        request: ModelRequest,
    ) -> Result<BoxStream<'static, Result<ModelChunk, ModelError>>, ModelError> {
        logged_stream(
            PROVIDER,
            self.open_stream(request).await,
            self.secret.clone(),
        )
    }
}

/// `{base}/v1/messages`, or `{base}/messages` when the base already ends in `/v1`.
fn messages_url(base_url: &str) -> String {
    let base = base_url.trim().trim_end_matches('/');
    if base.ends_with("/v1") {
        format!("{base}/messages")
    } else {
        format!("{base}/v1/messages")
    }
}
