//! Pausing, resuming and steering running turns, on the lead.
//!
//! Record: any lead consumes `RunControl`s from `SKEIN_APPROVALS` (subject
//! `skein.control.{tenant}.{task}`, consumer `skein-leads-control`, work queue: one lead records
//! each), checks who sent them (`admission`: pause and resume take the `operate` role, steer
//! `submit` or `operate`), writes them to the task's controls in Redis (`store::control`) and publishes the task's
//! wake (`skein.wake.{tenant}.{task}`). A control that cannot be read or belongs elsewhere is set
//! aside; one that cannot be written (Redis away) is offered again.
//!
//! Act: the turn-start script returns the task's controls with the rest of the start; while the
//! turn runs, the wake raises its flag in [`RunningTurns`], and only then does the turn read the
//! controls again ([`LeadControls`]), at its next step boundary: nothing is read from Redis for a
//! turn nobody controls. A paused turn stops there (`TurnStop::Paused`), emits `paused`, and is
//! parked like a turn waiting for approval (no slot, no lease, attempt uncounted) until a wake
//! finds it resumed, a cancel request, its deadline or shutdown; the turn that runs after it
//! emits `resumed`. Steer messages join before the next model call, each once: the checkpoint
//! counts those taken. A wake that is lost delays a control until the turn's next start.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use skein_common::agent::seams::{ControlUpdate, TurnControls};
use skein_common::audit::AuditRecord;
use skein_common::bus::{Disposition, Received};
use skein_common::principals::Operation;
use skein_common::protocol::{ControlAction, Failure, RunControl};
use skein_common::store::control::Controls;
use skein_common::store::SessionStore;
use skein_common::subjects;

use crate::admission::Admission;
use crate::by_task::{ByTask, Registered};
use crate::server::Lead;

/// Controls recorded at once by one lead.
pub const CONTROL_CONCURRENCY: usize = 8;
/// Delay before a control that could not be recorded (Redis away) is offered again.
const CONTROL_RETRY: Duration = Duration::from_secs(1);

/// The turns running on this lead, by tenant and task, each with the flag a wake raises.
#[derive(Clone, Default)]
pub struct RunningTurns {
    flags: ByTask<Arc<AtomicBool>>,
}

impl RunningTurns {
    /// Registers a running turn; its flag is raised by every wake of the task until the entry
    /// drops.
    pub fn register(
        &self,
        tenant: &str,
        task_id: &str,
    ) -> (Arc<AtomicBool>, Registered<Arc<AtomicBool>>) {
        let flag = Arc::new(AtomicBool::new(false));
        let entry = self.flags.register(tenant, task_id, flag.clone());
        (flag, entry)
    }

    /// A wake for the task: its running turn looks at its controls at the next boundary.
    pub fn raise(&self, tenant: &str, task_id: &str) {
        if let Some(flag) = self.flags.get(tenant, task_id) {
            flag.store(true, Ordering::Release);
        }
    }
}

/// One running turn's view of its controls: those its start read, then the store's whenever a
/// wake raised the flag. It borrows what the turn holds anyway (a turn in flight is memory the
/// lead pays for each of its thousands of turns).
pub struct LeadControls<'a> {
    store: &'a SessionStore,
    tenant: &'a str,
    session: &'a str,
    task_id: &'a str,
    raised: Arc<AtomicBool>,
    at_start: Mutex<Option<Controls>>,
}

impl<'a> LeadControls<'a> {
    pub fn new(
        store: &'a SessionStore,
        origin: (&'a str, &'a str, &'a str),
        raised: Arc<AtomicBool>,
        at_start: Controls,
    ) -> Self {
        let (tenant, session, task_id) = origin;
        Self {
            store,
            tenant,
            session,
            task_id,
            raised,
            at_start: Mutex::new(Some(at_start)),
        }
    }

    async fn read(&self, steered: u32) -> Result<ControlUpdate, Failure> {
        let (controls, steer) = self
            .store
            .controls(self.tenant, self.session, self.task_id, steered)
            .await
            .map_err(|e| e.to_failure())?;
        Ok(update(&controls, steer))
    }
}

fn update(controls: &Controls, steer: Vec<String>) -> ControlUpdate {
    ControlUpdate {
        paused: controls.paused,
        interrupted_by: controls.interrupted_by.clone(),
        steer,
    }
}

impl TurnControls for LeadControls<'_> {
    fn changed(&self, steered: u32) -> BoxFuture<'_, Result<Option<ControlUpdate>, Failure>> {
        Box::pin(async move {
            let at_start = self.at_start.lock().ok().and_then(|mut s| s.take());
            if let Some(start) = at_start {
                if start.steered > steered {
                    // Messages the start only counted: read them.
                    return self.read(steered).await.map(Some);
                }
                if start.paused || start.interrupted_by.is_some() {
                    return Ok(Some(update(&start, Vec::new())));
                }
            }
            if self.raised.swap(false, Ordering::AcqRel) {
                return self.read(steered).await.map(Some);
            }
            Ok(None)
        })
    }
}

impl Lead {
    /// Records one published `RunControl` and wakes the task it controls.
    pub(crate) async fn handle_control(self: Arc<Self>, received: Received<RunControl>) {
        let (envelope, control) = match received {
            Received::Decoded(delivery) => delivery.into_parts(),
            Received::Undecodable(undecodable) => {
                let why = undecodable.body().to_string();
                let (envelope, _) = undecodable.into_parts();
                return self.refuse(envelope, "control", &why).await;
            }
        };
        if let Err(failure) = control.validate() {
            return self.refuse(envelope, "control", &failure.message).await;
        }
        let on_subject = subjects::parse_control(envelope.subject());
        if on_subject != Some((control.tenant.as_str(), control.task_id.as_str())) {
            let why = format!(
                "published on {}; a control of this task goes to {}",
                envelope.subject(),
                subjects::control(&control.tenant, &control.task_id)
            );
            return self.refuse(envelope, "control", &why).await;
        }
        let operation = match control.action {
            ControlAction::Pause => Operation::Pause,
            ControlAction::Resume => Operation::Resume,
            ControlAction::Steer => Operation::Steer,
        };
        let acting = match self
            .admit(
                &envelope,
                &control.tenant,
                &control.task_id,
                operation,
                &control.by,
            )
            .await
        {
            Admission::Admitted(acting) => acting,
            Admission::Refused(why) => return self.refuse(envelope, "control", &why).await,
            Admission::Unchecked => {
                envelope
                    .settle(Disposition::Retry(Some(CONTROL_RETRY)))
                    .await;
                return;
            }
        };
        let recorded = self
            .store
            .record_control(
                &control.tenant,
                &control.session,
                &control.task_id,
                control.action,
                &control.text,
            )
            .await;
        let disposition = match recorded {
            Ok(()) => {
                tracing::info!(tenant = %control.tenant, task_id = %control.task_id, action = control.action.as_str(), by = %acting.name(), "control recorded");
                let record = AuditRecord::done(
                    &acting,
                    &control.tenant,
                    control.action.as_str(),
                    &control.task_id,
                );
                self.bus
                    .audit(&record, &envelope.stream_sequence().to_string())
                    .await;
                self.wake(&control.tenant, &control.task_id).await;
                Disposition::Ack
            }
            Err(e) => {
                tracing::warn!(error = %e, "control not recorded; retrying");
                Disposition::Retry(Some(CONTROL_RETRY))
            }
        };
        envelope.settle(disposition).await;
    }

    /// Tells every lead that the task's controls or answers changed.
    pub(crate) async fn wake(&self, tenant: &str, task_id: &str) {
        if let Err(e) = self
            .bus
            .client()
            .publish(subjects::wake(tenant, task_id), Vec::<u8>::new().into())
            .await
        {
            // A parked turn still wakes at its expiry or redelivery; a running one reads its
            // controls at its next start.
            tracing::warn!(error = %e, "wake not published");
        }
    }
}
