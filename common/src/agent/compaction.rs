//! Compaction: when a session's history, or a turn's own steps, are summarised, where they are
//! cut, and what the model is asked. The decisions here are pure; the runtime makes the summary's
//! model call (`runtime/compact.rs`) and the lead stores the session's summary with the session.
//!
//! A model call is about to go out with the system prompt, the tools, the session's history and
//! the turn so far. When that would take more than [`ContextLimits::compact_at_percent`] of the
//! agent's context (counted in tokens), or the history holds more than
//! [`ContextLimits::max_history_messages`] messages, the older part of the history is summarised
//! ([`plan`]): the most recent turns are kept verbatim (up to [`ContextLimits::keep_percent`] of
//! the context, no more than the rest of the request leaves under the threshold, and half the
//! message limit), the cut always falls on a user message (a turn's start), so a tool call is
//! never separated from its result. A model that answers that its context overflowed forces a
//! compaction of every earlier turn.
//!
//! A turn whose own steps still do not fit has its older steps summarised ([`plan_steps`]): its
//! input and its latest steps are kept verbatim (at least the latest step: the model's last calls
//! and every result they got), the cut falls on a step's start (an assistant message, or a user
//! message that steered the turn), never between calls and their results. The summary of a turn's
//! steps lives with the turn only: the session stores the turn's messages whole. A request that
//! cannot fit even then (the latest step alone is larger than the context) fails, and
//! [`overflow_reason`] says what it is made of.
//!
//! The summary request is a transcript of the older messages (and the previous summary, folded
//! in), with long tool results cut to their head and tail: a result that was kept whole in the
//! workspace still names its path there, so nothing is lost, only out of the context. A summary
//! longer than a quarter of the context (in bytes) is cut to its head and tail too.

use std::collections::HashMap;

use crate::agent::context::ContextLimits;
use crate::agent::tokens::TokenCounter;
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
    let other_tokens = count_other();
    let tokens_before = other_tokens + per_message.iter().sum::<u64>();
    let trigger = if overflowed {
        Trigger::Overflow
    } else if tokens_before > threshold {
        Trigger::Tokens
    } else if too_many {
        Trigger::Messages
    } else {
        return None;
    };
    let keep_tokens = keep_tokens(trigger, context_tokens, threshold, other_tokens, limits);
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

/// How much of the newest messages a compaction keeps verbatim: up to `keep_percent` of the
/// context, and no more than the rest of the request (`other_tokens`) leaves under the
/// threshold, so a turn that fills the context by itself keeps no earlier turn. The model knows
/// its context better than any count: after an overflow nothing is kept but what must be.
fn keep_tokens(
    trigger: Trigger,
    context_tokens: u64,
    threshold: u64,
    other_tokens: u64,
    limits: &ContextLimits,
) -> u64 {
    if trigger == Trigger::Overflow {
        return 0;
    }
    (context_tokens.saturating_mul(u64::from(limits.keep_percent)) / 100)
        .min(threshold.saturating_sub(other_tokens))
}

/// A compaction of a turn's own steps: `turn[from..cut]` is summarised (with the summary of
/// `turn[1..from]`, if there is one, folded in); the turn's input `turn[0]` and `turn[cut..]`
/// are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepsPlan {
    pub from: usize,
    pub cut: usize,
    pub trigger: Trigger,
    /// The request's tokens before compacting.
    pub tokens_before: u64,
}

/// Where the latest step of `turn[from..]` starts: the model's last message (its calls, then
/// their results and anything after them). `None` before the model's first step.
pub fn latest_step(turn: &[Message], from: usize) -> Option<usize> {
    (from.max(1)..turn.len())
        .rev()
        .find(|&i| turn[i].role == Role::Assistant)
}

/// Whether the steps of `turn` (its messages so far, the input first) should be compacted before
/// a request to a model with `context_tokens`, and where to cut them. `turn[1..from]` is what an
/// earlier compaction of the turn summarised; `per_message` counts every message of `turn`;
/// `other_tokens` counts the rest of the request (system prompt with its summaries, tools,
/// history, and the turn's input). The latest step is always kept, and the cut falls on a step's
/// start, so a call is never separated from its results.
pub fn plan_steps(
    turn: &[Message],
    from: usize,
    per_message: &[u64],
    other_tokens: u64,
    context_tokens: u64,
    limits: &ContextLimits,
    overflowed: bool,
) -> Option<StepsPlan> {
    debug_assert_eq!(per_message.len(), turn.len(), "one count a message");
    let threshold = context_tokens.saturating_mul(u64::from(limits.compact_at_percent)) / 100;
    let from = from.clamp(1, turn.len().max(1));
    let tokens_before = other_tokens + per_message.get(from..)?.iter().sum::<u64>();
    let trigger = if overflowed {
        Trigger::Overflow
    } else if tokens_before > threshold {
        Trigger::Tokens
    } else {
        return None;
    };
    let latest = latest_step(turn, from)?;
    let keep_tokens = keep_tokens(trigger, context_tokens, threshold, other_tokens, limits);
    let mut first_kept = turn.len();
    let mut kept_tokens = 0;
    while first_kept > from {
        let tokens = per_message[first_kept - 1];
        if kept_tokens + tokens > keep_tokens {
            break;
        }
        kept_tokens += tokens;
        first_kept -= 1;
    }
    // The first step's start in what fits; the latest step's start at the latest.
    let cut = (first_kept..latest)
        .find(|&i| matches!(turn[i].role, Role::Assistant | Role::User))
        .unwrap_or(latest);
    (cut > from).then_some(StepsPlan {
        cut,
        from,
        trigger,
        tokens_before,
    })
}

/// What a request that cannot fit is made of (tokens), for [`overflow_reason`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Floor {
    /// The system prompt (with its summaries) and the tool specs.
    pub fixed: u64,
    /// The turn's input.
    pub input: u64,
    /// The turn's latest step: its calls and their results.
    pub latest: u64,
}

impl Floor {
    pub fn total(&self) -> u64 {
        self.fixed + self.input + self.latest
    }
}

/// Why a turn's request cannot fit in a context of `context_tokens`, though the history and the
/// turn's earlier steps are summarised: what is left, and the largest result of its latest step
/// (starting at `latest`). `refused`: the model said so (else the count did).
pub fn overflow_reason(
    turn: &[Message],
    latest: Option<usize>,
    floor: Floor,
    context_tokens: u64,
    refused: bool,
) -> String {
    let mut parts = format!(
        "the system prompt and tool specs take ~{} tokens, the turn's input ~{}",
        floor.fixed, floor.input
    );
    if let Some(latest) = latest.filter(|&l| l < turn.len()) {
        parts.push_str(&format!(", its latest step ~{}", floor.latest));
        let largest = turn[latest..]
            .iter()
            .filter(|m| m.role == Role::Tool)
            .max_by_key(|m| m.content.len());
        if let Some(result) = largest {
            let tool = turn[latest]
                .tool_calls
                .iter()
                .find(|c| result.tool_call_id.as_deref() == Some(c.id.as_str()))
                .map_or("?", |c| c.name.as_str());
            parts.push_str(&format!(
                " (its largest result, from {tool}, is {} bytes)",
                result.content.len()
            ));
        }
    }
    let kept = "the turn's input and its latest step are kept whole";
    if refused {
        format!(
            "the model refused the request as longer than its context, and nothing is left to \
             compact ({kept}): {parts}"
        )
    } else {
        format!(
            "the request needs ~{} tokens, more than the model's context of {context_tokens}, \
             even with the history and the turn's earlier steps summarised ({kept}): {parts}",
            floor.total()
        )
    }
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

/// The instructions of a request that summarises a turn's own earlier steps.
pub const STEPS_SUMMARY_INSTRUCTIONS: &str = "You compact the earlier steps an AI agent took on a \
request it is still working on, so it can go on without them. For every tool call, write which \
tool it called with which arguments and what came back, condensed to what the request needs: \
facts, numbers, names, file paths, URLs, identifiers, errors. Then what the agent concluded and \
what it was about to do. Be concise: short bullet points in the order of the calls, nothing \
invented. Fold the earlier summary, if one is given, into yours. Answer with the summary only.";

/// The messages of a summary request: instructions, then a transcript of `older` (with the
/// previous summary first), within `max_bytes` (the oldest messages are left out first).
pub fn summary_request(
    previous: Option<&str>,
    older: &[Message],
    limits: &ContextLimits,
    max_bytes: usize,
) -> Vec<Message> {
    let mut transcript = String::new();
    if let Some(previous) = previous {
        transcript.push_str("Earlier summary:\n");
        transcript.push_str(previous);
        transcript.push_str("\n\n");
    }
    transcript.push_str("Conversation to summarise:\n");
    let room = max_bytes.saturating_sub(transcript.len() + 256);
    push_transcript(&mut transcript, older, limits, room);
    vec![
        Message::system(SUMMARY_INSTRUCTIONS),
        Message::user(transcript),
    ]
}

/// The messages of a request that summarises a turn's steps `older`: instructions, then the
/// turn's `input` (cut short: it stays in the turn verbatim), the summary of its steps before
/// `older` if there is one, and a transcript of `older` (every call with its arguments, every
/// result), within `max_bytes` (the oldest messages are left out first).
pub fn steps_summary_request(
    input: &str,
    previous: Option<&str>,
    older: &[Message],
    limits: &ContextLimits,
    max_bytes: usize,
) -> Vec<Message> {
    let mut transcript = format!(
        "The request the agent works on:\n{}\n\n",
        cut_middle(input, limits.transcript_result_bytes)
    );
    if let Some(previous) = previous {
        transcript.push_str("Earlier summary of its steps:\n");
        transcript.push_str(previous);
        transcript.push_str("\n\n");
    }
    transcript.push_str("Steps to summarise:\n");
    let room = max_bytes.saturating_sub(transcript.len() + 256);
    push_transcript(&mut transcript, older, limits, room);
    vec![
        Message::system(STEPS_SUMMARY_INSTRUCTIONS),
        Message::user(transcript),
    ]
}

/// Appends a transcript of `older` to `transcript`, within `room` bytes: over it, every message
/// is cut shorter (to a share of the room) before the oldest are left out, with a note.
fn push_transcript(
    transcript: &mut String,
    older: &[Message],
    limits: &ContextLimits,
    room: usize,
) {
    // A result's line names its tool, found by its call's id.
    let tools: HashMap<&str, &str> = older
        .iter()
        .flat_map(|m| &m.tool_calls)
        .map(|c| (c.id.as_str(), c.name.as_str()))
        .collect();
    let line = |m: &Message, cap: usize| transcript_line(m, cap, &tools);
    let mut lines: Vec<String> = older
        .iter()
        .map(|m| line(m, limits.transcript_result_bytes))
        .collect();
    if lines.iter().map(|l| l.len() + 1).sum::<usize>() > room && !older.is_empty() {
        // Less the line's prefix and the cut's note; never longer than the first cut.
        let longest = limits.transcript_result_bytes;
        let share = (room / older.len())
            .saturating_sub(64)
            .clamp(MIN_LINE_BYTES.min(longest), longest);
        lines = older.iter().map(|m| line(m, share)).collect();
    }
    let mut budget = room;
    let mut first = lines.len();
    while first > 0 && lines[first - 1].len() < budget {
        budget -= lines[first - 1].len() + 1;
        first -= 1;
    }
    if first > 0 {
        transcript.push_str(&format!(
            "[{first} older messages left out: too long to summarise at once]\n"
        ));
    }
    for line in &lines[first..] {
        transcript.push_str(line);
        transcript.push('\n');
    }
}

/// One message as a transcript line; long texts cut to head and tail. A tool result names its
/// tool when `tools` (call id to tool name) knows its call.
fn transcript_line(message: &Message, cap: usize, tools: &HashMap<&str, &str>) -> String {
    let mut line = match message.role {
        Role::User => format!("user: {}", cut_middle(&message.content, cap)),
        Role::Assistant => format!("assistant: {}", cut_middle(&message.content, cap)),
        Role::Tool => {
            let id = message.tool_call_id.as_deref().unwrap_or("?");
            let of = match tools.get(id) {
                Some(tool) => format!("{tool} {id}"),
                None => id.to_owned(),
            };
            format!("tool result ({of}): {}", cut_middle(&message.content, cap))
        }
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

/// The system-prompt section that carries the summary of a turn's own earlier steps.
pub fn steps_section(summary: &str, messages: u64) -> String {
    format!(
        "Summary of your earlier steps in this turn ({messages} messages compacted: the calls \
         you made and what they returned; the turn keeps them, the workspace keeps every file). \
         The user's message and your latest steps follow verbatim:\n{summary}"
    )
}

/// The byte size of a request's parts other than the history (see [`RequestSize`]): the system
/// prompt, the tool specs, and `turn_bytes` of the turn's messages as sent.
pub fn other_bytes(system: &str, tools_bytes: u64, turn_bytes: u64) -> u64 {
    system.len() as u64 + tools_bytes + turn_bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::tokens;
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

    /// A turn: its input, then `steps` steps of one call (`c0`, ...) and its result of about
    /// `size` characters each.
    fn turn(steps: usize, size: usize) -> Vec<Message> {
        let mut turn = vec![Message::user("do it")];
        for i in 0..steps {
            let mut call = Message::assistant("");
            call.tool_calls.push(ToolCall {
                id: format!("c{i}"),
                name: "fetch".into(),
                arguments: serde_json::json!({"page": i}),
            });
            turn.push(call);
            turn.push(Message::tool_result(format!("c{i}"), "r".repeat(size)));
        }
        turn
    }

    fn plan_turn(turn: &[Message], from: usize, overflowed: bool) -> Option<StepsPlan> {
        let counts = counts(turn, &TokenCounter::Estimate);
        plan_steps(turn, from, &counts, 50, 4_000, &limits(), overflowed)
    }

    #[test]
    fn a_turn_over_the_threshold_keeps_its_input_and_latest_steps_and_cuts_at_a_call() {
        let turn = turn(6, 2_000); // ~500 tokens a result, ~3,050 in all
        let plan = plan_turn(&turn, 1, false).expect("over 75% of 4,000");
        assert_eq!(plan.trigger, Trigger::Tokens);
        assert_eq!(plan.from, 1);
        // 30% of 4,000 keeps at most 1,200 tokens: the last two steps (~1,030), not three.
        assert_eq!(plan.cut, 9);
        assert_eq!(turn[plan.cut].tool_calls[0].id, "c4");
        assert!(plan.tokens_before > 3_000);
    }

    #[test]
    fn no_cut_of_a_turn_separates_a_call_from_its_results_or_takes_its_latest_step() {
        for size in [10, 500, 1_500, 3_000, 9_000] {
            for steps in 1..8 {
                let mut turn = turn(steps, size);
                // A step of two calls, whose results come together.
                let mut pair = Message::assistant("");
                for id in ["p0", "p1"] {
                    pair.tool_calls.push(ToolCall {
                        id: id.into(),
                        name: "fetch".into(),
                        arguments: serde_json::json!({}),
                    });
                }
                turn.insert(1, pair);
                turn.insert(2, Message::tool_result("p0", "r".repeat(size)));
                turn.insert(3, Message::tool_result("p1", "r".repeat(size)));
                for overflowed in [false, true] {
                    let Some(plan) = plan_turn(&turn, 1, overflowed) else {
                        continue;
                    };
                    let latest = latest_step(&turn, 1).expect("a step");
                    assert_eq!(turn[plan.cut].role, Role::Assistant, "{size} {steps}");
                    assert!(plan.cut > plan.from && plan.cut <= latest, "{size} {steps}");
                }
            }
        }
    }

    #[test]
    fn after_an_overflow_only_the_latest_step_of_a_turn_is_kept() {
        let turn = turn(4, 40);
        let plan = plan_turn(&turn, 1, true).expect("an overflow compacts what it can");
        assert_eq!(plan.trigger, Trigger::Overflow);
        assert_eq!(plan.cut, turn.len() - 2);
        // Compacted again later: what an earlier summary stands for is not summarised again.
        let mut longer = turn.clone();
        longer.extend(self::turn(3, 40).into_iter().skip(1).map(|mut m| {
            for call in &mut m.tool_calls {
                call.id = format!("later-{}", call.id);
            }
            if let Some(id) = &mut m.tool_call_id {
                *id = format!("later-{id}");
            }
            m
        }));
        let again = plan_turn(&longer, plan.cut, true).expect("new steps to compact");
        assert_eq!(again.from, plan.cut);
        assert_eq!(again.cut, longer.len() - 2);
    }

    #[test]
    fn a_turn_with_one_step_or_none_has_nothing_to_compact() {
        for turn in [turn(0, 20_000), turn(1, 20_000)] {
            assert_eq!(plan_turn(&turn, 1, true), None);
        }
        // Nor one whose only step after its summary is the latest.
        let turn = turn(3, 20_000);
        assert_eq!(plan_turn(&turn, 5, true), None);
    }

    #[test]
    fn a_message_that_steered_the_turn_stays_with_the_latest_step_or_starts_what_is_kept() {
        let mut turn = turn(4, 2_000);
        turn.push(Message::user("also check page 9"));
        let plan = plan_turn(&turn, 1, true).expect("an overflow compacts");
        // Kept: the latest call, its result and the steer message after them.
        assert_eq!(plan.cut, turn.len() - 3);
        // A steer message between steps is a step's start too.
        let mut turn = self::turn(2, 2_000);
        turn.push(Message::user("now page 9"));
        turn.extend(self::turn(4, 2_000).into_iter().skip(1));
        let plan = plan_turn(&turn, 1, false).expect("over the threshold");
        assert!(matches!(turn[plan.cut].role, Role::User | Role::Assistant));
    }

    #[test]
    fn a_turn_that_fills_the_threshold_keeps_no_earlier_turn_verbatim() {
        let history = history(4, 600); // ~155 tokens a message, ~1,900 in all
        let plan_with = |turn_tokens: u64| {
            plan(
                &history,
                size_of(&history),
                || turn_tokens,
                || counts(&history, &TokenCounter::Estimate),
                2_000,
                &limits(),
                false,
            )
            .expect("over 75% of 2,000")
        };
        // A small turn leaves room for the last earlier turn (30% of the context).
        assert_eq!(plan_with(25).cut, 12);
        // A turn of 1,600 tokens is over the threshold of 1,500 by itself: every earlier turn
        // is summarised.
        assert_eq!(plan_with(1_600).cut, history.len());
        // One of 1,100 leaves 400 tokens under it: less than the last turn's ~480.
        assert_eq!(plan_with(1_100).cut, history.len());
    }

    #[test]
    fn a_steps_summary_request_names_each_call_with_its_arguments_and_result() {
        let turn = turn(3, 50);
        let request = steps_summary_request(
            &turn[0].content,
            Some("- fetched page 0 earlier"),
            &turn[1..5],
            &limits(),
            20_000,
        );
        assert_eq!(request[0].content, STEPS_SUMMARY_INSTRUCTIONS);
        let transcript = &request[1].content;
        assert!(transcript.starts_with("The request the agent works on:\ndo it\n\n"));
        assert!(transcript.contains("Earlier summary of its steps:\n- fetched page 0 earlier"));
        assert!(transcript.contains("called fetch (c0) with {\"page\":0}"));
        assert!(transcript.contains("tool result (fetch c1): rrr"));
        assert!(!transcript.contains("c2"), "{transcript}");
    }

    #[test]
    fn an_overflow_reason_names_the_largest_result_of_the_latest_step() {
        let mut turn = turn(2, 10);
        turn.last_mut().expect("a result").content = "r".repeat(20_000);
        let floor = Floor {
            fixed: 100,
            input: 5,
            latest: 5_010,
        };
        let counted = overflow_reason(&turn, latest_step(&turn, 1), floor, 4_096, false);
        assert_eq!(
            counted,
            "the request needs ~5115 tokens, more than the model's context of 4096, even with \
             the history and the turn's earlier steps summarised (the turn's input and its \
             latest step are kept whole): the system prompt and tool specs take ~100 tokens, \
             the turn's input ~5, its latest step ~5010 (its largest result, from fetch, is \
             20000 bytes)"
        );
        let refused = overflow_reason(&turn[..1], None, floor, 4_096, true);
        assert!(
            refused.starts_with("the model refused the request"),
            "{refused}"
        );
        assert!(!refused.contains("latest step ~"), "{refused}");
    }
}
