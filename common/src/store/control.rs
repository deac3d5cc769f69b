//! What was asked of a task while it runs or waits: a pause (until resumed), messages to steer it
//! with, and an interrupt by a later task of its session (`multitask: interrupt`).
//!
//! Keys (the session's hash tag, so the turn-start script reads them with the rest):
//! `skein:{tenant:session}:control:{task_id}`, a hash — `paused` ("1" while paused), `was_paused`
//! ("1" from a pause until the turn that runs after it reports `resumed`), `interrupt` (the task
//! that interrupted it), `steered` (how many steer messages there are) — and
//! `skein:{tenant:session}:steer:{task_id}`, the steer messages in order. Both expire
//! [`CONTROL_TTL_SECS`] after their last change; `forget_turn` removes them.
//!
//! Invariants: a steer message is appended once per recorded control (the lead consuming the
//! control acks it only after the write), and a turn takes the messages after the count its
//! checkpoint carries, so each joins the turn once; the interrupting task is written, never
//! changed by the task it names.

use redis::AsyncCommands;

use super::{keys, SessionStore, StoreError};
use crate::protocol::ControlAction;

/// How long a task's controls are kept after their last change.
pub const CONTROL_TTL_SECS: u64 = 7 * 24 * 3600;

/// The controls of a task, as a turn sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Controls {
    pub paused: bool,
    /// Paused since the last turn that ran; the next turn that runs reports `resumed`.
    pub was_paused: bool,
    /// The later task of the session that interrupted this one.
    pub interrupted_by: Option<String>,
    /// Steer messages recorded for the task so far.
    pub steered: u32,
}

impl Controls {
    /// Whether anything asks the turn to change course.
    pub fn any(&self) -> bool {
        self.paused || self.was_paused || self.interrupted_by.is_some() || self.steered > 0
    }

    /// Reads the hash's fields as the turn-start script returns them (`""` for absent).
    pub(super) fn from_fields(
        paused: &str,
        was_paused: &str,
        interrupt: &str,
        steered: &str,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            paused: paused == "1",
            was_paused: was_paused == "1",
            interrupted_by: (!interrupt.is_empty()).then(|| interrupt.to_owned()),
            steered: match steered {
                "" => 0,
                n => n.parse().map_err(|_| StoreError::BadNumber {
                    what: "steer count",
                    text: n.chars().take(32).collect(),
                })?,
            },
        })
    }
}

impl SessionStore {
    /// Records a pause, resume or steer of a task.
    pub async fn record_control(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
        action: ControlAction,
        text: &str,
    ) -> Result<(), StoreError> {
        let control = keys::control(tenant, session, task_id);
        let steer = keys::steer(tenant, session, task_id);
        let mut pipe = redis::pipe();
        pipe.atomic();
        match action {
            ControlAction::Pause => {
                pipe.hset_multiple(&control, &[("paused", "1"), ("was_paused", "1")])
                    .ignore();
            }
            ControlAction::Resume => {
                pipe.hdel(&control, "paused").ignore();
            }
            ControlAction::Steer => {
                pipe.rpush(&steer, text)
                    .ignore()
                    .hincr(&control, "steered", 1)
                    .ignore()
                    .expire(&steer, CONTROL_TTL_SECS as i64)
                    .ignore();
            }
        }
        pipe.expire(&control, CONTROL_TTL_SECS as i64).ignore();
        let mut conn = self.connection.clone();
        let () = pipe.query_async(&mut conn).await?;
        Ok(())
    }

    /// Records that task `by` interrupts task `task_id` of the same session.
    pub async fn request_interrupt(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
        by: &str,
    ) -> Result<(), StoreError> {
        let control = keys::control(tenant, session, task_id);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .hset(&control, "interrupt", by)
            .ignore()
            .expire(&control, CONTROL_TTL_SECS as i64)
            .ignore();
        let mut conn = self.connection.clone();
        let () = pipe.query_async(&mut conn).await?;
        Ok(())
    }

    /// A task's controls, and its steer messages from index `steer_from` on.
    pub async fn controls(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
        steer_from: u32,
    ) -> Result<(Controls, Vec<String>), StoreError> {
        let mut conn = self.connection.clone();
        let (fields, steer): (Vec<Option<String>>, Vec<String>) = redis::pipe()
            .cmd("HMGET")
            .arg(keys::control(tenant, session, task_id))
            .arg(&["paused", "was_paused", "interrupt", "steered"])
            .lrange(
                keys::steer(tenant, session, task_id),
                steer_from as isize,
                -1,
            )
            .query_async(&mut conn)
            .await?;
        let field = |i: usize| fields.get(i).cloned().flatten().unwrap_or_default();
        let controls = Controls::from_fields(&field(0), &field(1), &field(2), &field(3))?;
        Ok((controls, steer))
    }

    /// Notes that the turn running after a pause reported `resumed`.
    pub async fn clear_was_paused(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let _: i64 = conn
            .hdel(keys::control(tenant, session, task_id), "was_paused")
            .await?;
        Ok(())
    }
}
