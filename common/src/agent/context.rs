//! Context management: what of a session's history goes to the model. Huge tool results from
//! earlier turns are evicted to a short preview (the full text stays in the session), and very long
//! histories keep only their most recent messages, never splitting a tool call from its results.

use crate::protocol::message::{Message, Role};

/// Limits applied when preparing history for a model call.
#[derive(Debug, Clone, Copy)]
pub struct ContextLimits {
    /// Tool results of earlier turns longer than this are cut to a preview.
    pub max_old_tool_result_bytes: usize,
    /// Most messages of history sent to the model.
    pub max_history_messages: usize,
}

impl Default for ContextLimits {
    fn default() -> Self {
        Self {
            max_old_tool_result_bytes: 4 * 1024,
            max_history_messages: 200,
        }
    }
}

/// The history as the model should see it.
pub fn prepare(history: &[Message], limits: ContextLimits) -> Vec<Message> {
    let mut start = history.len().saturating_sub(limits.max_history_messages);
    // Never start on a tool result whose call was cut off, nor on an assistant's answer.
    while start < history.len() && history[start].role != Role::User {
        start += 1;
    }
    if start == history.len() {
        start = history.len().saturating_sub(limits.max_history_messages);
    }
    history[start..]
        .iter()
        .map(|m| {
            if m.role == Role::Tool && m.content.len() > limits.max_old_tool_result_bytes {
                let mut cut = limits.max_old_tool_result_bytes;
                while !m.content.is_char_boundary(cut) {
                    cut -= 1;
                }
                let mut evicted = m.clone();
                evicted.content = format!(
                    "{}\n[evicted from context: {} bytes total]",
                    &m.content[..cut],
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
        };
        let prepared = prepare(&history, limits);
        assert!(prepared[1].content.starts_with("xxxxxxxxxx\n[evicted"));
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
            },
        );
        assert_eq!(prepared[0].content, "q4");
        assert_eq!(prepared.len(), 3);
    }
}
