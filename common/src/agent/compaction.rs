//! Compaction: when a session's history is summarised, where it is cut, and what the model is
//! asked. The decisions here are pure; the runtime makes the summary's model call
//! (`runtime/compact.rs`) and the lead stores the result with the session.
//!
//! A model call is about to go out with the system prompt, the tools, the session's history and
//! the turn so far. When that would take more than [`ContextLimits::compact_at_percent`] of the
//! agent's context (counted in tokens), or the history holds more than
//! [`ContextLimits::max_history_messages`] messages, the older part of the history is summarised:
//! the most recent turns are kept verbatim (up to [`ContextLimits::keep_percent`] of the context,
//! and half the message limit), the cut always falls on a user message (a turn's start), so a tool
//! call is never separated from its result. A model that answers that its context overflowed
//! forces a compaction of every earlier turn.
//!
//! The summary request is a transcript of the older messages (and the previous summary, folded
//! in), with long tool results cut to their head and tail: a result that was kept whole in the
//! workspace still names its path there, so nothing is lost, only out of the context. A summary
//! longer than a quarter of the context (in bytes) is cut to its head and tail too.

use crate::agent::context::ContextLimits;
use crate::agent::tokens::{self, TokenCounter};
use crate::protocol::message::{Message, Role};
use crate::text::{ceil_char_boundary, floor_char_boundary};

/// Why a history is compacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The request would take more of the context than allowed.
    Tokens,
    /// The history holds more messages than allowed.
    Messages,
    /// The model said its context overflowed.
    Overflow,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Tokens => "tokens",
            Trigger::Messages => "messages",
            Trigger::Overflow => "overflow",
        }
    }
}

/// A compaction to make: summarise `history[..cut]`, keep the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub cut: usize,
    pub trigger: Trigger,
    /// The request's tokens before compacting.
    pub tokens_before: u64,
}

/// What one model request holds besides the history: counted once per request.
#[derive(Debug, Clone, Copy)]
pub struct RequestSize {
    /// Bytes of the system prompt, the tool specs and the turn's own messages (an upper bound of
    /// their tokens).
    pub other_bytes: u64,
    /// Bytes of the history (an upper bound of its tokens).
    pub history_bytes: u64,
}

/// Whether `history` should be compacted before a request of `size` to a model with
/// `context_tokens`, and where to cut it. `count_other` counts the tokens of everything but the
/// history exactly, `count_history` those of each message of `history` (see [`counts`]); they
/// are only called when the byte bound says the limit may be crossed.
pub fn plan<C: AsRef<[u64]>>(
    history: &[Message],
    size: RequestSize,
    count_other: impl FnOnce() -> u64,
    count_history: impl FnOnce() -> C,
    context_tokens: u64,
    limits: &ContextLimits,
    overflowed: bool,
) -> Option<Plan> {
    // Saturating: a context size that arrived in a message may be any number.
    let threshold = context_tokens.saturating_mul(u64::from(limits.compact_at_percent)) / 100;
    let too_many = history.len() > limits.max_history_messages;
    let may_exceed = size.other_bytes + size.history_bytes > threshold;
    if !overflowed && !too_many && !may_exceed {
        return None;
    }
    let per_message = count_history();
    let per_message = per_message.as_ref();
    debug_assert_eq!(per_message.len(), history.len(), "one count a message");
    let tokens_before = count_other() + per_message.iter().sum::<u64>();
    let trigger = if overflowed {
        Trigger::Overflow
    } else if tokens_before > threshold {
        Trigger::Tokens
    } else if too_many {
        Trigger::Messages
    } else {
        return None;
    };
    // The model knows its context better than any count: after an overflow no earlier turn is
    // kept verbatim.
    let keep_tokens = if trigger == Trigger::Overflow {
        0
    } else {
        context_tokens.saturating_mul(u64::from(limits.keep_percent)) / 100
    };
    let keep_messages = limits.max_history_messages / 2;
    // The oldest message that still fits in what is kept, walking back from the newest.
    let mut first_kept = history.len();
    let mut kept_tokens = 0;
    while first_kept > 0 {
        let tokens = per_message[first_kept - 1];
        if kept_tokens + tokens > keep_tokens || history.len() - first_kept >= keep_messages {
            break;
        }
        kept_tokens += tokens;
        first_kept -= 1;
    }
    // Cut at a turn's start, so calls and their results stay together.
    let cut = (first_kept..history.len())
        .find(|&i| history[i].role == Role::User)
        .unwrap_or(history.len());
    (cut > 0).then_some(Plan {
        cut,
        trigger,
        tokens_before,
    })
}

/// The tokens of each of `messages`, as [`plan`] takes them.
pub fn counts(messages: &[Message], counter: &TokenCounter) -> Vec<u64> {
    messages.iter().map(|m| counter.message(m)).collect()
}

/// The most of the context a summary may take (percent, counted in bytes, which bound tokens):
/// a model that answers at length must not fill the context with the summary that was to make
/// room in it (every later request of the session would carry it, and overflow).
const SUMMARY_MAX_PERCENT: u64 = 25;

/// The longest summary kept for a context of `context_tokens`: a longer one is cut to its head
/// and tail.
pub fn max_summary_bytes(context_tokens: u64) -> usize {
    usize::try_from(context_tokens.saturating_mul(SUMMARY_MAX_PERCENT) / 100).unwrap_or(usize::MAX)
}

/// The least of a message a transcript shows when it must cut every message short.
const MIN_LINE_BYTES: usize = 240;

/// The instructions of a summary request.
pub const SUMMARY_INSTRUCTIONS: &str = "You compact the earlier part of a conversation between a \
user and an AI agent, so the agent can go on without it. Write a summary that keeps what the user \
asked for and still wants, decisions made and why, facts learned (names, numbers, file paths, \
URLs, identifiers), what the tools did and found, and what is left to do. Be concise: short \
bullet points, nothing invented. Fold the earlier summary, if one is given, into yours. Answer \
with the summary only.";

/// The messages of a summary request: instructions, then a transcript of `older` (with the
/// previous summary first), within `max_bytes` (the oldest messages are left out first).
pub fn summary_request(
    previous: Option<&str>,
    older: &[Message],
    limits: &ContextLimits,
    max_bytes: usize,
) -> Vec<Message> {
    let room = max_bytes.saturating_sub(previous.map_or(0, str::len) + 256);
    let mut lines: Vec<String> = older
        .iter()
        .map(|m| transcript_line(m, limits.transcript_result_bytes))
        .collect();
    // Over the room, every message is cut shorter (to a share of the room) before any is left
    // out.
    if lines.iter().map(|l| l.len() + 1).sum::<usize>() > room && !older.is_empty() {
        // Less the line's prefix and the cut's note; never longer than the first cut.
        let longest = limits.transcript_result_bytes;
        let share = (room / older.len())
            .saturating_sub(64)
            .clamp(MIN_LINE_BYTES.min(longest), longest);
        lines = older.iter().map(|m| transcript_line(m, share)).collect();
    }
    let mut budget = room;
    let mut first = lines.len();
    while first > 0 && lines[first - 1].len() < budget {
        budget -= lines[first - 1].len() + 1;
        first -= 1;
    }
    let mut transcript = String::new();
    if let Some(previous) = previous {
        transcript.push_str("Earlier summary:\n");
        transcript.push_str(previous);
        transcript.push_str("\n\n");
    }
    transcript.push_str("Conversation to summarise:\n");
    if first > 0 {
        transcript.push_str(&format!(
            "[{first} older messages left out: too long to summarise at once]\n"
        ));
    }
    for line in &lines[first..] {
        transcript.push_str(line);
        transcript.push('\n');
    }
    vec![
        Message::system(SUMMARY_INSTRUCTIONS),
        Message::user(transcript),
    ]
}

/// One message as a transcript line; long texts cut to head and tail.
fn transcript_line(message: &Message, cap: usize) -> String {
    let mut line = match message.role {
        Role::User => format!("user: {}", cut_middle(&message.content, cap)),
        Role::Assistant => format!("assistant: {}", cut_middle(&message.content, cap)),
        Role::Tool => format!(
            "tool result ({}): {}",
            message.tool_call_id.as_deref().unwrap_or("?"),
            cut_middle(&message.content, cap)
        ),
        Role::System => format!("system: {}", cut_middle(&message.content, cap)),
    };
    for call in &message.tool_calls {
        line.push_str(&format!(
            "\n  called {} ({}) with {}",
            call.name,
            call.id,
            cut_middle(&call.arguments.to_string(), cap / 2)
        ));
    }
    line
}

/// `text` whole when it fits in `cap` bytes, else its head and tail with a note between.
pub fn cut_middle(text: &str, cap: usize) -> String {
    if text.len() <= cap {
        return text.to_owned();
    }
    let head = floor_char_boundary(text, cap * 2 / 3);
    let tail = ceil_char_boundary(text, text.len() - cap / 3).max(head);
    format!(
        "{}\n[... {} bytes left out ...]\n{}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
}

/// The system-prompt section that carries a session's summary.
pub fn summary_section(summary: &str, messages: u64) -> String {
    format!(
        "Summary of the earlier conversation ({messages} messages compacted; the session keeps \
         them, the workspace keeps every file):\n{summary}"
    )
}

/// The byte size of a request's parts other than the history (see [`RequestSize`]).
pub fn other_bytes(system: &str, tools_bytes: u64, turn_messages: &[Message]) -> u64 {
    system.len() as u64 + tools_bytes + tokens::upper_bound(turn_messages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::message::ToolCall;

    fn limits() -> ContextLimits {
        ContextLimits {
            max_history_messages: 20,
            compact_at_percent: 75,
            keep_percent: 30,
            ..ContextLimits::default()
        }
    }

    /// `turns` turns of a user message, a tool call, its result and an answer, each message
    /// about `size` characters.
    fn history(turns: usize, size: usize) -> Vec<Message> {
        let mut history = Vec::new();
        for i in 0..turns {
            history.push(Message::user(format!("q{i} {}", "u".repeat(size))));
            let mut call = Message::assistant("");
            call.tool_calls.push(ToolCall {
                id: format!("c{i}"),
                name: "read_file".into(),
                arguments: serde_json::json!({"path": "a"}),
            });
            history.push(call);
            history.push(Message::tool_result(format!("c{i}"), "r".repeat(size)));
            history.push(Message::assistant(format!("a{i} {}", "a".repeat(size))));
        }
        history
    }

    fn size_of(history: &[Message]) -> RequestSize {
        RequestSize {
            other_bytes: 100,
            history_bytes: tokens::upper_bound(history),
        }
    }

    #[test]
    fn a_history_that_fits_is_left_alone_without_counting() {
        let history = history(3, 40);
        let plan = plan(
            &history,
            size_of(&history),
            || panic!("no exact count is needed under the byte bound"),
            || -> Vec<u64> { panic!("nor a count of the history") },
            100_000,
            &limits(),
            false,
        );
        assert_eq!(plan, None);
    }

    #[test]
    fn a_history_over_the_threshold_is_cut_at_a_turn_start_keeping_recent_turns() {
        let history = history(4, 600); // ~155 tokens a message, ~1,900 in all
        let plan = plan(
            &history,
            size_of(&history),
            || 25,
            || counts(&history, &TokenCounter::Estimate),
            2_000,
            &limits(),
            false,
        )
        .expect("1,900 + 25 tokens is over 75% of 2,000");
        assert_eq!(plan.trigger, Trigger::Tokens);
        assert_eq!(history[plan.cut].role, Role::User);
        // 30% of 2,000 keeps at most 600 tokens: the last turn (~480), not two.
        assert_eq!(plan.cut, 12);
        assert!(plan.tokens_before > 1_500);
    }

    #[test]
    fn too_many_messages_compact_down_to_half_the_limit() {
        let history = history(8, 1); // 32 messages, limit 20
        let plan = plan(
            &history,
            size_of(&history),
            || 25,
            || counts(&history, &TokenCounter::Estimate),
            1_000_000,
            &limits(),
            false,
        )
        .expect("over the message limit");
        assert_eq!(plan.trigger, Trigger::Messages);
        assert!(history.len() - plan.cut <= 10);
        assert_eq!(history[plan.cut].role, Role::User);
    }

    #[test]
    fn a_transcript_cuts_every_message_shorter_before_leaving_any_out() {
        let older = history(4, 1_200);
        let request = summary_request(None, &older, &limits(), 4_000);
        let transcript = &request[1].content;
        assert!(transcript.len() <= 4_000, "{}", transcript.len());
        assert!(
            !transcript.contains("older messages left out"),
            "{transcript}"
        );
        assert!(transcript.contains("user: q0 ") && transcript.contains("assistant: a3 "));
    }

    #[test]
    fn an_overflow_compacts_even_a_small_history_and_keeps_less() {
        let history = history(4, 600);
        let normal = plan(
            &history,
            size_of(&history),
            || 25,
            || counts(&history, &TokenCounter::Estimate),
            2_000,
            &limits(),
            false,
        )
        .expect("over the threshold");
        let forced = plan(
            &history,
            size_of(&history),
            || 25,
            || counts(&history, &TokenCounter::Estimate),
            4_000,
            &limits(),
            true,
        )
        .expect("an overflow always compacts what it can");
        assert_eq!(forced.trigger, Trigger::Overflow);
        assert!(forced.cut >= normal.cut);
    }

    #[test]
    fn a_single_huge_turn_is_summarised_whole_rather_than_split() {
        let history = history(1, 10_000);
        let plan = plan(
            &history,
            size_of(&history),
            || 25,
            || counts(&history, &TokenCounter::Estimate),
            2_000,
            &limits(),
            false,
        )
        .expect("over the threshold");
        assert_eq!(plan.cut, history.len());
    }

    #[test]
    fn a_transcript_limit_below_the_shortest_line_cuts_without_panicking() {
        let tight = ContextLimits {
            transcript_result_bytes: 100,
            ..limits()
        };
        let older = history(4, 1_200);
        let request = summary_request(None, &older, &tight, 2_000);
        let transcript = &request[1].content;
        assert!(transcript.contains("assistant: a3 "), "{transcript}");
        assert!(transcript.len() <= 2_000, "{}", transcript.len());
    }

    #[test]
    fn any_context_size_plans_without_overflowing() {
        let history = history(4, 600);
        for context_tokens in [0, u64::MAX / 2, u64::MAX] {
            let plan = plan(
                &history,
                size_of(&history),
                || 25,
                || counts(&history, &TokenCounter::Estimate),
                context_tokens,
                &limits(),
                false,
            );
            if context_tokens > 0 {
                assert_eq!(
                    plan, None,
                    "{context_tokens}: a huge context fits everything"
                );
            }
        }
    }

    #[test]
    fn the_summary_request_cuts_long_results_and_fits_its_byte_budget() {
        let older = history(30, 5_000);
        let request = summary_request(Some("before: x"), &older, &limits(), 20_000);
        assert_eq!(request.len(), 2);
        let transcript = &request[1].content;
        assert!(transcript.len() <= 20_000, "{}", transcript.len());
        assert!(transcript.starts_with("Earlier summary:\nbefore: x"));
        assert!(transcript.contains("older messages left out"));
        assert!(transcript.contains("bytes left out"));
        // The newest messages are the ones kept.
        assert!(transcript.contains("a29 "));
        assert!(transcript.contains("called read_file (c29)"));
    }
}
