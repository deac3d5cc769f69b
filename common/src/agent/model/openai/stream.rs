//! Streamed answers of the OpenAI-compatible client: server-sent events read within the idle and
//! whole-call bounds ([`SseReader`]), deltas assembled into one response ([`StreamAccumulator`]:
//! tool calls by index, or by id where a server reuses one index), and the stream of deltas ending
//! in the assembled response ([`sse_answer`]): reasoning pieces as [`ModelChunk::Reasoning`], text
//! pieces as [`ModelChunk::Delta`], in the order the server sent them (a chunk carrying both gives
//! its reasoning first).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;

use super::*;
use crate::agent::model::sse::TimedEvents;

#[derive(Debug, Deserialize)]
pub(super) struct StreamChunk {
    #[serde(default)]
    choices: Vec<StreamChoice>,
    usage: Option<WireUsage>,
    /// Some servers report a failure inside the stream.
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub(super) struct StreamChoice {
    #[serde(default)]
    index: usize,
    delta: Option<StreamDelta>,
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct StreamDelta {
    content: Option<String>,
    /// Reasoning text of thinking models (DeepSeek), streamed before the answer.
    reasoning_content: Option<String>,
    /// The same under the name OpenRouter and recent vLLM use; read only when a delta has no
    /// `reasoning_content` (some servers send both, with the same text).
    reasoning: Option<String>,
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ToolCallDelta {
    pub(super) index: Option<usize>,
    pub(super) id: Option<String>,
    pub(super) function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
pub(super) struct FunctionDelta {
    pub(super) name: Option<String>,
    pub(super) arguments: Option<String>,
}

/// A tool call being assembled from deltas.
#[derive(Debug, Default)]
pub(super) struct PartialToolCall {
    id: String,
    name: String,
    arguments: String,
}

/// Assembles a streamed answer from its chunks; pure, so it is tested without a server.
#[derive(Debug, Default)]
pub(super) struct StreamAccumulator {
    content: String,
    reasoning: String,
    /// Reasoning absorbed since [`take_reasoning`](Self::take_reasoning) last took it.
    fresh_reasoning: String,
    /// Calls in the order they started.
    tool_calls: Vec<PartialToolCall>,
    /// The call each wire `index` currently continues (a position in `tool_calls`).
    by_index: BTreeMap<usize, usize>,
    finish_reason: Option<String>,
    usage: Usage,
}

impl StreamAccumulator {
    /// Takes in one chunk; returns its text, if it carried any (its reasoning waits for
    /// [`take_reasoning`](Self::take_reasoning)).
    pub(super) fn absorb(&mut self, chunk: StreamChunk) -> Result<Option<String>, ModelError> {
        if let Some(error) = chunk.error {
            // Mid-stream errors are the server's trouble (overload, upstream failure), not an
            // answer: trying again may help.
            return Err(reported_error(&error, true));
        }
        if let Some(usage) = chunk.usage {
            self.usage = usage.into();
        }
        let mut text = String::new();
        for choice in chunk.choices.into_iter().filter(|choice| choice.index == 0) {
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason);
            }
            let Some(delta) = choice.delta else { continue };
            if let Some(piece) = delta.content {
                text.push_str(&piece);
            }
            if let Some(piece) = delta.reasoning_content.or(delta.reasoning) {
                self.reasoning.push_str(&piece);
                self.fresh_reasoning.push_str(&piece);
            }
            for call_delta in delta.tool_calls.unwrap_or_default() {
                self.absorb_tool_call(call_delta)?;
            }
        }
        self.content.push_str(&text);
        Ok((!text.is_empty()).then_some(text))
    }

    /// The reasoning absorbed since the last call (empty when none came).
    pub(super) fn take_reasoning(&mut self) -> String {
        std::mem::take(&mut self.fresh_reasoning)
    }

    pub(super) fn absorb_tool_call(&mut self, delta: ToolCallDelta) -> Result<(), ModelError> {
        // The call this delta continues: the one at its `index` (the last call when the server
        // omits it), unless the delta brings a new id — servers that reuse one index for
        // parallel calls (Ollama) or omit it start a new call that way.
        let new_id = delta.id.as_deref().filter(|id| !id.is_empty());
        let current = match delta.index {
            Some(index) => self.by_index.get(&index).copied(),
            None => self.tool_calls.len().checked_sub(1),
        };
        let continues = current.filter(|&position| {
            let known = &self.tool_calls[position].id;
            new_id.is_none_or(|id| known.is_empty() || known == id)
        });
        let position = match continues {
            Some(position) => position,
            None => {
                if self.tool_calls.len() >= MAX_TOOL_CALLS {
                    return Err(ModelError::BadResponse(format!(
                        "the response carries more than {MAX_TOOL_CALLS} tool calls"
                    )));
                }
                self.tool_calls.push(PartialToolCall::default());
                self.tool_calls.len() - 1
            }
        };
        if let Some(index) = delta.index {
            self.by_index.insert(index, position);
        }
        let call = &mut self.tool_calls[position];
        if let Some(id) = delta.id.filter(|id| !id.is_empty()) {
            call.id = id;
        }
        if let Some(function) = delta.function {
            if let Some(name) = function.name.filter(|name| !name.is_empty()) {
                if call.name.is_empty() {
                    call.name = name;
                }
            }
            if let Some(piece) = function.arguments {
                call.arguments.push_str(&piece);
            }
        }
        Ok(())
    }

    fn has_finished(&self) -> bool {
        self.finish_reason.is_some()
    }

    pub(super) fn finish(self) -> ModelResponse {
        let tool_calls = self
            .tool_calls
            .into_iter()
            .enumerate()
            .map(|(position, call)| ToolCall {
                id: if call.id.is_empty() {
                    fallback_call_id(position)
                } else {
                    call.id
                },
                name: call.name,
                arguments: decode_arguments(&call.arguments),
            })
            .collect();
        ModelResponse {
            message: Message {
                role: Role::Assistant,
                content: self.content,
                tool_calls,
                tool_call_id: None,
                reasoning: (!self.reasoning.is_empty()).then_some(self.reasoning),
                reasoning_signature: None,
                images: Vec::new(),
            },
            finish_reason: self.finish_reason,
            usage: self.usage,
        }
    }
}

/// What the next event of a stream brought.
pub(super) enum SseProgress {
    Reasoning(String),
    Text(String),
    Finished,
}

pub(super) struct SseReader {
    events: TimedEvents,
    accumulator: StreamAccumulator,
    /// Text of a chunk whose reasoning was handed out first.
    queued_text: Option<String>,
}

impl SseReader {
    async fn next_progress(&mut self) -> Result<SseProgress, ModelError> {
        if let Some(text) = self.queued_text.take() {
            return Ok(SseProgress::Text(text));
        }
        loop {
            let Some(event) = self.events.next().await? else {
                if self.accumulator.has_finished() {
                    return Ok(SseProgress::Finished);
                }
                return Err(ModelError::Interrupted(
                    "the stream ended before [DONE] and without a finish reason".to_owned(),
                ));
            };
            let data = event.data.trim();
            if data == "[DONE]" {
                return Ok(SseProgress::Finished);
            }
            let chunk: StreamChunk = serde_json::from_str(data).map_err(|error| {
                ModelError::BadResponse(format!(
                    "undecodable stream chunk ({error}): {}",
                    crate::text::cut(data, 200)
                ))
            })?;
            let text = self.accumulator.absorb(chunk)?;
            let reasoning = self.accumulator.take_reasoning();
            match (reasoning.is_empty(), text) {
                (false, text) => {
                    self.queued_text = text;
                    return Ok(SseProgress::Reasoning(reasoning));
                }
                (true, Some(text)) => return Ok(SseProgress::Text(text)),
                (true, None) => {}
            }
        }
    }
}

/// Turns a server-sent-events body into reasoning and text deltas followed by the assembled
/// response. The stream ends after its first error.
pub(super) fn sse_answer<B>(
    body: BoxStream<'static, Result<B, BodyError>>,
    idle_timeout: Duration,
    deadline: tokio::time::Instant,
) -> BoxStream<'static, Result<ModelChunk, ModelError>>
where
    B: AsRef<[u8]> + Send + 'static,
{
    let reader = SseReader {
        events: TimedEvents::new(body, idle_timeout, deadline),
        accumulator: StreamAccumulator::default(),
        queued_text: None,
    };
    futures::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        match reader.next_progress().await {
            Ok(SseProgress::Reasoning(text)) => {
                Some((Ok(ModelChunk::Reasoning(text)), Some(reader)))
            }
            Ok(SseProgress::Text(text)) => Some((Ok(ModelChunk::Delta(text)), Some(reader))),
            Ok(SseProgress::Finished) => {
                let response = std::mem::take(&mut reader.accumulator).finish();
                Some((Ok(ModelChunk::Done(response)), None))
            }
            Err(error) => Some((Err(error), None)),
        }
    })
    .boxed()
}
