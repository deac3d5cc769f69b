//! What a person asks of a running task besides cancelling it: pause it, resume it, or steer it
//! with a message (`RunControl`, published durably on `skein.control.{tenant}.{task_id}`).
//!
//! Invariants: tenant, session and task id are checked tokens before any key or subject is built
//! from them; a steer text is non-empty and at most [`MAX_STEER_BYTES`].

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{validate_token, Failure, FailureKind};

/// Longest steer message, in bytes.
pub const MAX_STEER_BYTES: usize = 64 * 1024;

/// A control of a running (or queued) task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunControl {
    pub v: u32,
    pub tenant: String,
    /// The task's session (its controls are kept with the session's keys).
    pub session: String,
    pub task_id: String,
    pub action: ControlAction,
    /// With `steer`: the user message that joins the turn before its next model call.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
    /// Who asked (for the audit trail).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub by: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ControlAction {
    /// Dispatch nothing new; park at the next step boundary until resumed.
    Pause,
    Resume,
    /// Add `text` as a user message before the turn's next model call.
    Steer,
}

impl ControlAction {
    pub fn as_str(self) -> &'static str {
        match self {
            ControlAction::Pause => "pause",
            ControlAction::Resume => "resume",
            ControlAction::Steer => "steer",
        }
    }
}

impl RunControl {
    /// Checks the names and the text.
    pub fn validate(&self) -> Result<(), Failure> {
        validate_token("tenant", &self.tenant)?;
        validate_token("session", &self.session)?;
        validate_token("task_id", &self.task_id)?;
        let invalid = |message: String| Err(Failure::new(FailureKind::InvalidInput, message));
        match self.action {
            ControlAction::Steer if self.text.trim().is_empty() => {
                invalid("a steer message needs a text".into())
            }
            ControlAction::Steer if self.text.len() > MAX_STEER_BYTES => invalid(format!(
                "a steer message is at most {MAX_STEER_BYTES} bytes"
            )),
            ControlAction::Pause | ControlAction::Resume if !self.text.is_empty() => {
                invalid(format!("{} takes no text", self.action.as_str()))
            }
            _ => Ok(()),
        }
    }
}
