//! A turn's answer against its agent's output schema: settled as it is without one, checked and
//! asked to be repaired (once a turn) when it fails, ended `invalid_output` when the repair fails
//! too, and checked again after the `after_turn` hooks rewrote it.

use super::*;

/// What became of an answer that would end the turn.
pub(super) enum Settled {
    /// It ends the turn: `out` holds it (and its `output`, for a structured answer).
    Ended,
    /// It did not match the output schema, and a repair request was added: the model is asked
    /// again.
    Repair,
    /// It did not match, also after the turn's repair: why, and the answer.
    Failed(String, String),
}

/// Settles the answer `text` that would end the turn: as it is without an output schema;
/// otherwise checked, and asked to be repaired (once a turn) when it fails.
///
/// Settled before the future is made, which only sends the repair's `output_discarded` event:
/// every turn's steps keep this future inline, and an `async fn` would hold its arguments
/// twice and its whole check across that rare await.
pub(super) fn settle_answer<'t>(
    turn: &'t TurnInput<'_>,
    out: &mut TurnOutput,
    structured: Option<&Structured>,
    text: String,
) -> impl std::future::Future<Output = Settled> + Send + 't {
    let (settled, discarded) = match structured {
        None => {
            out.answer = Some(text);
            (Settled::Ended, None)
        }
        Some(structured) => match structured.check(&text) {
            Ok(checked) => {
                out.answer = Some(checked.text);
                out.output = Some(checked.value);
                (Settled::Ended, None)
            }
            Err(problems) if out.new_messages.iter().any(is_repair_request) => {
                (Settled::Failed(problems, text), None)
            }
            Err(problems) => {
                tracing::info!(%problems, "the answer does not match the output schema; asking for a repair");
                // What the answer streamed is not the turn's answer.
                let discarded = turn.events.emit(EventKind::OutputDiscarded {
                    failure: Failure::new(
                        FailureKind::InvalidOutput,
                        format!(
                            "the answer does not match the output schema {:?}: {problems}",
                            structured.schema.name
                        ),
                    ),
                });
                out.new_messages.push(structured.repair_request(&problems));
                (Settled::Repair, Some(discarded))
            }
        },
    };
    async move {
        if let Some(discarded) = discarded {
            discarded.await;
        }
        settled
    }
}

/// A turn whose answer still does not match its output schema after the repair: it ends
/// `invalid_output`, with the last answer and what is wrong with it.
pub(super) fn invalid_output(
    turn: &TurnInput<'_>,
    mut out: TurnOutput,
    structured: Option<&Structured>,
    problems: &str,
    answer: String,
) -> Result<TurnOutput, TurnStop> {
    interrupted_if_cancelled(turn)?;
    out.status = TurnStatus::InvalidOutput;
    out.answer = Some(answer);
    out.output = None;
    out.failure = structured.map(|s| s.failure(problems));
    Ok(out)
}

/// Checks again a structured answer the `after_turn` hooks rewrote: its `output` follows the new
/// text, or the turn ends `invalid_output` when the text no longer matches.
pub(super) fn recheck_rewritten(agent: &AgentSpec, out: &mut TurnOutput) {
    let Ok(Some(structured)) = Structured::of(agent) else {
        return;
    };
    let Some(answer) = out.answer.clone() else {
        out.output = None;
        return;
    };
    match structured.check(&answer) {
        Ok(checked) => {
            out.answer = Some(checked.text);
            out.output = Some(checked.value);
        }
        Err(problems) => {
            out.output = None;
            out.status = TurnStatus::InvalidOutput;
            out.failure = Some(Failure::new(
                FailureKind::InvalidOutput,
                format!(
                    "the answer as the turn's hooks left it does not match the output schema \
                     {:?}: {problems}",
                    structured.schema.name
                ),
            ));
        }
    }
}
