//! The calls of a recorded turn, to answer a replay of it from the record: a call whose tool and
//! arguments match one the recorded turn made gets that call's observation instead of running
//! again, so a replay repeats no side effect; a call that differs runs.
//!
//! Invariants: each recorded call answers at most one call of the replay (two identical calls
//! are answered by the two recorded results, in order); arguments match as JSON values (key order
//! and spacing do not matter).

use std::sync::Mutex;

use serde_json::Value;

use crate::protocol::message::{Message, Role, ToolCall};

/// The recorded calls of one turn with their observations.
#[derive(Debug, Default)]
pub struct RecordedCalls {
    calls: Vec<(String, Value, String)>,
    used: Mutex<Vec<bool>>,
}

impl RecordedCalls {
    /// The calls a turn's messages asked for, each with the observation its result message
    /// carried (calls without one are left out: they never ended).
    pub fn from_messages(messages: &[Message]) -> Self {
        let mut calls = Vec::new();
        for message in messages.iter().filter(|m| m.role == Role::Assistant) {
            for call in &message.tool_calls {
                let observed = messages.iter().find(|m| {
                    m.role == Role::Tool && m.tool_call_id.as_deref() == Some(call.id.as_str())
                });
                if let Some(observed) = observed {
                    calls.push((
                        call.name.clone(),
                        call.arguments.clone(),
                        observed.content.clone(),
                    ));
                }
            }
        }
        let used = Mutex::new(vec![false; calls.len()]);
        Self { calls, used }
    }

    /// The recorded observation of a call like `call` not used yet.
    pub fn answer(&self, call: &ToolCall) -> Option<String> {
        let mut used = self.used.lock().ok()?;
        let index = self
            .calls
            .iter()
            .enumerate()
            .position(|(i, (name, args, _))| {
                !used[i] && *name == call.name && *args == call.arguments
            })?;
        used[index] = true;
        Some(self.calls[index].2.clone())
    }

    /// How many recorded calls answered a call.
    pub fn served(&self) -> usize {
        self.used
            .lock()
            .map(|u| u.iter().filter(|u| **u).count())
            .unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.calls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(id: &str, name: &str, arguments: Value) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments,
        }
    }

    #[test]
    fn matching_calls_are_answered_once_each_and_others_are_not() {
        let mut asked = Message::assistant("");
        asked.tool_calls = vec![
            call("c1", "read_file", json!({"path": "a", "limit": 1})),
            call("c2", "read_file", json!({"path": "a", "limit": 1})),
            call("c3", "http_fetch", json!({"url": "x"})),
        ];
        let messages = vec![
            Message::user("go"),
            asked,
            Message::tool_result("c1", "first"),
            Message::tool_result("c2", "second"),
        ];
        let recorded = RecordedCalls::from_messages(&messages);
        assert_eq!(recorded.len(), 2, "c3 never ended");
        let same = call("n1", "read_file", json!({"limit": 1, "path": "a"}));
        assert_eq!(recorded.answer(&same).as_deref(), Some("first"));
        assert_eq!(recorded.answer(&same).as_deref(), Some("second"));
        assert_eq!(recorded.answer(&same), None, "each record answers once");
        let other = call("n2", "read_file", json!({"path": "b", "limit": 1}));
        assert_eq!(recorded.answer(&other), None);
        assert_eq!(recorded.served(), 2);
    }
}
