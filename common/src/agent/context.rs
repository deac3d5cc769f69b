//! Context management: what of a session's history goes to the model. Huge tool results from
//! earlier turns are evicted to their head and tail (the full text stays in the session, and a
//! result kept whole in the workspace names its path in its tail); a history still over the
//! message limit after compaction (`compaction.rs`, which normally keeps it well under) keeps only
//! its most recent messages, never splitting a tool call from its results.

use crate::protocol::message::{Message, Role};

/// Limits applied when preparing history for a model call.
#[derive(Debug, Clone, Copy)]
pub struct ContextLimits {
    /// Tool results of earlier turns longer than this are cut to a preview.
    pub max_old_tool_result_bytes: usize,
    /// Most messages of history sent to the model; a history over it is compacted.
    pub max_history_messages: usize,
    /// Context size for models nobody configured and the tokenizer does not know.
    pub default_context_tokens: u64,
    /// A request that would take more than this share (percent) of the context compacts the
    /// history first.
    pub compact_at_percent: u8,
    /// Recent history kept verbatim by a compaction: at most this share (percent) of the context.
    pub keep_percent: u8,
    /// Tool results and arguments in a summary request are cut to this many bytes.
    pub transcript_result_bytes: usize,
}

impl Default for ContextLimits {
    fn default() -> Self {
        Self {
            max_old_tool_result_bytes: 4 * 1024,
            max_history_messages: 200,
            default_context_tokens: crate::agent::tokens::DEFAULT_CONTEXT_TOKENS,
            compact_at_percent: 75,
            keep_percent: 30,
            transcript_result_bytes: 2 * 1024,
        }
    }
}

/// The history as the model should see it: old tool results evicted, and at most the limit's
/// number of messages, starting at a user message.
pub fn prepare(history: &[Message], limits: ContextLimits) -> Vec<Message> {
    let start = trim_start(history, limits.max_history_messages);
    evict(&history[start..], limits.max_old_tool_result_bytes)
}

/// Where a history over `max_messages` is cut so it keeps its most recent ones: never on a tool
/// result whose call was cut off, nor on an assistant's answer.
pub fn trim_start(history: &[Message], max_messages: usize) -> usize {
    let floor = history.len().saturating_sub(max_messages);
    let mut start = floor;
    while start < history.len() && history[start].role != Role::User {
        start += 1;
    }
    if start == history.len() {
        floor
    } else {
        start
    }
}

/// `history` with every tool result over `max_result_bytes` cut to its head and tail.
pub fn evict(history: &[Message], max_result_bytes: usize) -> Vec<Message> {
    history
        .iter()
        .map(|m| {
            if m.role == Role::Tool && m.content.len() > max_result_bytes {
                let mut evicted = m.clone();
                evicted.content = format!(
                    "{}\n[evicted from context: {} bytes total]",
                    crate::agent::compaction::cut_middle(&m.content, max_result_bytes),
                    m.content.len()
                );
                evicted
            } else {
                m.clone()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_huge_old_tool_results() {
        let history = vec![
            Message::user("q"),
            Message::tool_result("c1", "x".repeat(100)),
        ];
        let limits = ContextLimits {
            max_old_tool_result_bytes: 10,
            max_history_messages: 10,
            ..ContextLimits::default()
        };
        let prepared = prepare(&history, limits);
        assert!(prepared[1]
            .content
            .starts_with("xxxxxx\n[... 91 bytes left out"));
        assert!(prepared[1].content.contains("100 bytes"));
    }

    #[test]
    fn trims_long_histories_at_a_user_message() {
        let mut history = Vec::new();
        for i in 0..5 {
            history.push(Message::user(format!("q{i}")));
            history.push(Message::tool_result("c", "r"));
            history.push(Message::assistant(format!("a{i}")));
        }
        let prepared = prepare(
            &history,
            ContextLimits {
                max_old_tool_result_bytes: 100,
                max_history_messages: 5,
                ..ContextLimits::default()
            },
        );
        assert_eq!(prepared[0].content, "q4");
        assert_eq!(prepared.len(), 3);
    }
}
