//! Streamed answers of the Anthropic client, read from the documented Messages streaming events:
//! `message_start` (usage so far), `content_block_start` / `content_block_delta` /
//! `content_block_stop` per content block, `message_delta` (stop reason, cumulative usage),
//! `message_stop`, `ping`, and `error`.
//!
//! [`MessageAccumulator`] assembles blocks by their `index` (pure, so it is tested without a
//! server): `text_delta`s are answer text, streamed as [`ModelChunk::Delta`]; `thinking_delta`s
//! are reasoning, streamed as [`ModelChunk::Reasoning`]; `signature_delta`s sign their thinking
//! block; `input_json_delta`s are pieces of a `tool_use` block's input, decoded once the answer is
//! whole (several `tool_use` blocks are parallel calls). `redacted_thinking` blocks, and block
//! and delta types this client does not know, are skipped; event types it does not know are
//! ignored, as the API asks of its clients.
//!
//! A structured answer (a request with an output schema) comes as a call of
//! [`ANSWER_TOOL`]: that block is not a tool call but the answer. Its input's JSON is streamed
//! as text deltas and becomes the message's text, in place of any text the model wrote beside it;
//! a message that holds only it ends as a plain answer (`end_turn`). Called beside other tools,
//! those calls stand and the answer's JSON is the message's text (the turn goes on with the
//! calls). Without an output schema a tool of that name is an ordinary call.
//!
//! The assembled message keeps its thinking as `Message::reasoning` and, when the answer had
//! exactly one thinking block and it came signed, the signature as `Message::reasoning_signature`
//! (several thinking blocks cannot be sent back faithfully as one text, so none is then).
//!
//! [`sse_answer`] reads the events within the idle and whole-call bounds: any bytes from the
//! server end a silence; the whole call ends by its deadline. The stream is whole at
//! `message_stop` (or when the body ends after a stop reason); a body that ends sooner is
//! [`ModelError::Interrupted`]. An `error` event is [`ModelError::ServerError`], retryable for
//! the server's own trouble (`overloaded_error`, `api_error`, `rate_limit_error`,
//! `timeout_error`).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;

use super::super::openai::MAX_TOOL_CALLS;
pub(super) use super::super::sse::BodyError;
use super::super::sse::TimedEvents;
use super::super::{ModelChunk, ModelError, ModelResponse};
use super::http::MAX_ERROR_BODY_BYTES;
use super::request::ANSWER_TOOL;
use crate::protocol::message::{Message, Role, ToolCall, Usage};

/// One streamed event (its `data`, tagged by `type`).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum StreamEvent {
    MessageStart {
        message: WireMessageStart,
    },
    ContentBlockStart {
        index: usize,
        content_block: WireBlock,
    },
    ContentBlockDelta {
        index: usize,
        delta: WireDelta,
    },
    /// Nothing to do: a block is whole when the message is.
    ContentBlockStop {},
    MessageDelta {
        #[serde(default)]
        delta: WireMessageDelta,
        usage: Option<WireUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: WireError,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Deserialize)]
pub(super) struct WireMessageStart {
    usage: Option<WireUsage>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct WireMessageDelta {
    stop_reason: Option<String>,
}

/// A content block as it starts (streamed) or whole (a whole answer's `content`).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum WireBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        #[serde(default)]
        id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        input: Value,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: String,
    },
    /// Encrypted thinking; nothing of it is kept (see the module header).
    RedactedThinking,
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum WireDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    SignatureDelta {
        signature: String,
    },
    #[serde(other)]
    Other,
}

/// Token counts; `message_delta` repeats them cumulatively, any of them may be absent.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
pub(super) struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

impl WireUsage {
    /// These counts, updated by the ones `newer` reports.
    fn updated(self, newer: WireUsage) -> WireUsage {
        WireUsage {
            input_tokens: newer.input_tokens.or(self.input_tokens),
            output_tokens: newer.output_tokens.or(self.output_tokens),
            cache_creation_input_tokens: newer
                .cache_creation_input_tokens
                .or(self.cache_creation_input_tokens),
            cache_read_input_tokens: newer
                .cache_read_input_tokens
                .or(self.cache_read_input_tokens),
        }
    }
}

impl From<WireUsage> for Usage {
    /// Anthropic's `input_tokens` leaves out the tokens read from and written to the cache; the
    /// prompt is all three.
    fn from(usage: WireUsage) -> Self {
        let written = usage.cache_creation_input_tokens.unwrap_or(0);
        let read = usage.cache_read_input_tokens.unwrap_or(0);
        Usage {
            prompt_tokens: usage
                .input_tokens
                .unwrap_or(0)
                .saturating_add(written)
                .saturating_add(read),
            completion_tokens: usage.output_tokens.unwrap_or(0),
            cache_read_tokens: read,
            cache_write_tokens: written,
        }
    }
}

/// An error the server reported (an `error` event, or an error body).
#[derive(Debug, Deserialize)]
pub(super) struct WireError {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    message: String,
}

impl WireError {
    pub(super) fn into_model_error(self) -> ModelError {
        let retryable = matches!(
            self.kind.as_str(),
            "overloaded_error" | "api_error" | "rate_limit_error" | "timeout_error"
        );
        let message = if self.kind.is_empty() {
            self.message
        } else {
            format!("{} ({})", self.message, self.kind)
        };
        ModelError::ServerError {
            message: crate::text::cut(&message, MAX_ERROR_BODY_BYTES),
            retryable,
        }
    }
}

/// A whole (not streamed) answer, or an error body in its place.
#[derive(Debug, Deserialize)]
pub(super) struct WholeMessage {
    #[serde(default)]
    content: Vec<WireBlock>,
    stop_reason: Option<String>,
    usage: Option<WireUsage>,
    error: Option<WireError>,
}

/// A content block being assembled.
#[derive(Debug)]
enum Block {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        /// The input the block started with (whole answers carry it all there).
        input: Value,
        /// The pieces of `input_json_delta`s.
        json: String,
    },
    Thinking {
        text: String,
        signature: String,
    },
    /// The call of [`ANSWER_TOOL`] that gives a structured answer.
    Answer {
        /// The input the block started with (whole answers carry it all there).
        input: Value,
        /// The pieces of `input_json_delta`s.
        json: String,
    },
    Skipped,
}

/// What one event brought.
#[derive(Debug, PartialEq)]
pub(super) enum Progress {
    Nothing,
    Text(String),
    Reasoning(String),
    Finished,
}

/// Assembles an answer from its events.
#[derive(Debug, Default)]
pub(super) struct MessageAccumulator {
    blocks: BTreeMap<usize, Block>,
    tool_uses: usize,
    usage: WireUsage,
    stop_reason: Option<String>,
    /// The request asked for a structured answer: a call of [`ANSWER_TOOL`] is the answer.
    structured: bool,
}

impl MessageAccumulator {
    /// An accumulator for the answer to a request with (`structured`) or without an output
    /// schema.
    pub(super) fn new(structured: bool) -> Self {
        Self {
            structured,
            ..Self::default()
        }
    }

    pub(super) fn absorb(&mut self, event: StreamEvent) -> Result<Progress, ModelError> {
        match event {
            StreamEvent::MessageStart { message } => {
                self.usage = self.usage.updated(message.usage.unwrap_or_default());
            }
            StreamEvent::ContentBlockStart {
                index,
                content_block,
            } => return self.start_block(index, content_block),
            StreamEvent::ContentBlockDelta { index, delta } => return self.delta(index, delta),
            StreamEvent::MessageDelta { delta, usage } => {
                if delta.stop_reason.is_some() {
                    self.stop_reason = delta.stop_reason;
                }
                self.usage = self.usage.updated(usage.unwrap_or_default());
            }
            StreamEvent::MessageStop => return Ok(Progress::Finished),
            StreamEvent::Error { error } => return Err(error.into_model_error()),
            StreamEvent::ContentBlockStop {} | StreamEvent::Ping | StreamEvent::Unknown => {}
        }
        Ok(Progress::Nothing)
    }

    /// Takes in a whole answer's blocks, stop reason and usage.
    pub(super) fn absorb_whole(&mut self, message: WholeMessage) -> Result<(), ModelError> {
        if let Some(error) = message.error {
            return Err(error.into_model_error());
        }
        for (index, block) in message.content.into_iter().enumerate() {
            // A whole answer's text is not streamed: what a block starts with is its all.
            self.start_block(index, block)?;
        }
        self.stop_reason = message.stop_reason;
        self.usage = message.usage.unwrap_or_default();
        Ok(())
    }

    /// Opens block `index`; the text or thinking it starts with, if any (the API starts them
    /// empty), is progress like a delta's.
    fn start_block(&mut self, index: usize, block: WireBlock) -> Result<Progress, ModelError> {
        if self.blocks.contains_key(&index) {
            return Err(ModelError::BadResponse(format!(
                "content block {index} started twice"
            )));
        }
        let (block, progress) = match block {
            WireBlock::Text { text } => (Block::Text(text.clone()), Progress::Text(text)),
            WireBlock::ToolUse { input, name, .. } if self.structured && name == ANSWER_TOOL => {
                let block = Block::Answer {
                    input,
                    json: String::new(),
                };
                (block, Progress::Nothing)
            }
            WireBlock::ToolUse { id, name, input } => {
                if self.tool_uses >= MAX_TOOL_CALLS {
                    return Err(ModelError::BadResponse(format!(
                        "the response carries more than {MAX_TOOL_CALLS} tool calls"
                    )));
                }
                self.tool_uses += 1;
                let block = Block::ToolUse {
                    id,
                    name,
                    input,
                    json: String::new(),
                };
                (block, Progress::Nothing)
            }
            WireBlock::Thinking {
                thinking,
                signature,
            } => {
                let block = Block::Thinking {
                    text: thinking.clone(),
                    signature,
                };
                (block, Progress::Reasoning(thinking))
            }
            WireBlock::RedactedThinking | WireBlock::Other => (Block::Skipped, Progress::Nothing),
        };
        self.blocks.insert(index, block);
        Ok(unless_empty(progress))
    }

    fn delta(&mut self, index: usize, delta: WireDelta) -> Result<Progress, ModelError> {
        let Some(block) = self.blocks.get_mut(&index) else {
            return Err(ModelError::BadResponse(format!(
                "a delta for content block {index}, which never started"
            )));
        };
        let progress = match (block, delta) {
            (Block::Text(text), WireDelta::TextDelta { text: piece }) => {
                text.push_str(&piece);
                Progress::Text(piece)
            }
            (Block::ToolUse { json, .. }, WireDelta::InputJsonDelta { partial_json }) => {
                json.push_str(&partial_json);
                Progress::Nothing
            }
            (Block::Answer { json, .. }, WireDelta::InputJsonDelta { partial_json }) => {
                json.push_str(&partial_json);
                Progress::Text(partial_json)
            }
            (Block::Thinking { text, .. }, WireDelta::ThinkingDelta { thinking }) => {
                text.push_str(&thinking);
                Progress::Reasoning(thinking)
            }
            (Block::Thinking { signature, .. }, WireDelta::SignatureDelta { signature: piece }) => {
                signature.push_str(&piece);
                Progress::Nothing
            }
            (Block::Skipped, _) | (_, WireDelta::Other) => Progress::Nothing,
            (block, delta) => {
                return Err(ModelError::BadResponse(format!(
                    "a {} for content block {index}, a {} block",
                    delta.kind(),
                    block.kind()
                )))
            }
        };
        Ok(unless_empty(progress))
    }

    fn has_stopped(&self) -> bool {
        self.stop_reason.is_some()
    }

    pub(super) fn finish(self) -> ModelResponse {
        let mut content = String::new();
        let mut tool_calls = Vec::new();
        let mut thinking: Vec<(String, String)> = Vec::new();
        let mut answer: Option<String> = None;
        for block in self.blocks.into_values() {
            match block {
                Block::Text(text) => content.push_str(&text),
                Block::ToolUse {
                    id,
                    name,
                    input,
                    json,
                } => {
                    let arguments = if json.trim().is_empty() {
                        match input {
                            object @ Value::Object(_) => object,
                            _ => Value::Object(Default::default()),
                        }
                    } else {
                        // Text that is not JSON (an answer cut by `max_tokens`) is kept as text,
                        // so the call is refused as invalid arguments, not the answer.
                        serde_json::from_str(&json).unwrap_or(Value::String(json))
                    };
                    let id = if id.is_empty() {
                        fallback_call_id(tool_calls.len())
                    } else {
                        id
                    };
                    tool_calls.push(ToolCall {
                        id,
                        name,
                        arguments,
                    });
                }
                Block::Thinking { text, signature } => thinking.push((text, signature)),
                Block::Answer { input, json } => {
                    answer = Some(if json.trim().is_empty() {
                        match input {
                            object @ Value::Object(_) => object.to_string(),
                            _ => "{}".to_owned(),
                        }
                    } else {
                        json
                    });
                }
                Block::Skipped => {}
            }
        }
        let mut finish_reason = self.stop_reason;
        if let Some(answer) = answer {
            content = answer;
            if tool_calls.is_empty() {
                // Given through a tool, but an answer: the turn ends with it.
                finish_reason = Some("end_turn".to_owned());
            }
        }
        let reasoning_signature = match thinking.as_slice() {
            [(_, signature)] if !signature.is_empty() => Some(signature.clone()),
            _ => None,
        };
        let reasoning: String = thinking.into_iter().map(|(text, _)| text).collect();
        ModelResponse {
            message: Message {
                role: Role::Assistant,
                content,
                tool_calls,
                tool_call_id: None,
                reasoning: (!reasoning.is_empty()).then_some(reasoning),
                reasoning_signature,
                images: Vec::new(),
            },
            finish_reason,
            usage: self.usage.into(),
        }
    }
}

/// An empty piece (the API opens blocks and tool inputs with one) is no progress to report.
fn unless_empty(progress: Progress) -> Progress {
    match progress {
        Progress::Text(piece) | Progress::Reasoning(piece) if piece.is_empty() => Progress::Nothing,
        progress => progress,
    }
}

impl Block {
    fn kind(&self) -> &'static str {
        match self {
            Block::Text(_) => "text",
            Block::ToolUse { .. } | Block::Answer { .. } => "tool_use",
            Block::Thinking { .. } => "thinking",
            Block::Skipped => "skipped",
        }
    }
}

impl WireDelta {
    fn kind(&self) -> &'static str {
        match self {
            WireDelta::TextDelta { .. } => "text_delta",
            WireDelta::InputJsonDelta { .. } => "input_json_delta",
            WireDelta::ThinkingDelta { .. } => "thinking_delta",
            WireDelta::SignatureDelta { .. } => "signature_delta",
            WireDelta::Other => "delta",
        }
    }
}

/// An id for a tool call the server sent without one: unique, so calls of later steps never
/// share an id with earlier ones.
fn fallback_call_id(position: usize) -> String {
    format!(
        "toolu_{position}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Parses a whole answer (a server that ignored `stream: true`), or the error in its place;
/// `structured` as for [`MessageAccumulator::new`].
pub(super) fn parse_whole(body: &[u8], structured: bool) -> Result<ModelResponse, ModelError> {
    let message: WholeMessage = serde_json::from_slice(body).map_err(|error| {
        let start = crate::text::cut(&String::from_utf8_lossy(body), 200);
        ModelError::BadResponse(format!("{error}; the body starts with: {start}"))
    })?;
    let mut accumulator = MessageAccumulator::new(structured);
    accumulator.absorb_whole(message)?;
    Ok(accumulator.finish())
}

// ---------------------------------------------------------------------------------------------
// Reading the events

struct SseReader {
    events: TimedEvents,
    accumulator: MessageAccumulator,
}

impl SseReader {
    async fn next_progress(&mut self) -> Result<Progress, ModelError> {
        loop {
            let Some(event) = self.events.next().await? else {
                if self.accumulator.has_stopped() {
                    return Ok(Progress::Finished);
                }
                return Err(ModelError::Interrupted(
                    "the stream ended before message_stop and without a stop reason".to_owned(),
                ));
            };
            let data = event.data.trim();
            let parsed: StreamEvent = serde_json::from_str(data).map_err(|error| {
                ModelError::BadResponse(format!(
                    "undecodable {} event ({error}): {}",
                    if event.event.is_empty() {
                        "stream"
                    } else {
                        event.event.as_str()
                    },
                    crate::text::cut(data, 200)
                ))
            })?;
            match self.accumulator.absorb(parsed)? {
                Progress::Nothing => {}
                progress => return Ok(progress),
            }
        }
    }
}

/// Turns a server-sent-events body into reasoning and text deltas followed by the assembled
/// response (`structured` as for [`MessageAccumulator::new`]). The stream ends after its first
/// error.
pub(super) fn sse_answer<B>(
    body: BoxStream<'static, Result<B, BodyError>>,
    idle_timeout: Duration,
    deadline: tokio::time::Instant,
    structured: bool,
) -> BoxStream<'static, Result<ModelChunk, ModelError>>
where
    B: AsRef<[u8]> + Send + 'static,
{
    let reader = SseReader {
        events: TimedEvents::new(body, idle_timeout, deadline),
        accumulator: MessageAccumulator::new(structured),
    };
    futures::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        match reader.next_progress().await {
            Ok(Progress::Reasoning(text)) => Some((Ok(ModelChunk::Reasoning(text)), Some(reader))),
            Ok(Progress::Text(text)) => Some((Ok(ModelChunk::Delta(text)), Some(reader))),
            Ok(Progress::Finished | Progress::Nothing) => {
                let response = std::mem::take(&mut reader.accumulator).finish();
                Some((Ok(ModelChunk::Done(response)), None))
            }
            Err(error) => Some((Err(error), None)),
        }
    })
    .boxed()
}
