//! The worker registry's entries: what a worker announces of itself (its pool, tools and agent
//! types), refreshed by heartbeats, and when an entry counts as alive and as routable.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::*;

/// A worker's announcement of itself, refreshed by heartbeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkerAnnouncement {
    pub v: u32,
    pub worker_id: String,
    pub pool: String,
    pub version: String,
    pub tools: Vec<ToolSpec>,
    /// Whether this worker runs subagent tasks.
    pub runs_subagents: bool,
    /// The subagent types it runs, when it runs only some (one consumer each); absent when it
    /// runs every type (or none: see `runs_subagents`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_types: Option<Vec<String>>,
    /// Tasks it runs at once.
    pub capacity: u32,
    /// Milliseconds since the Unix epoch of this heartbeat.
    pub heartbeat_ms: u64,
    /// Heartbeat period; a worker silent for three periods is gone.
    pub heartbeat_every_ms: u64,
}

/// How long calls are still routed to a silent worker's pool: its work queue keeps the calls
/// until a worker of the pool pulls them, so a short silence (a Redis outage that stopped the
/// heartbeats) must not make its tools vanish.
pub const ROUTABLE_SILENCE_MS: u64 = 60_000;

/// Longest heartbeat period a registry entry may claim (a forged entry must not stay alive for
/// ever by claiming a huge one); workers refuse a longer `--heartbeat`.
pub const MAX_HEARTBEAT_EVERY_MS: u64 = 60_000;

/// How far ahead of the reader's clock a heartbeat may be and still count (clock skew); an
/// entry further ahead is not believed (it would otherwise stay alive until that time).
pub const MAX_CLOCK_SKEW_MS: u64 = 30_000;

/// Most tools one registry entry may offer.
pub const MAX_ANNOUNCED_TOOLS: usize = 1024;

/// Most subagent types one registry entry may name.
pub const MAX_ANNOUNCED_AGENT_TYPES: usize = 256;

impl WorkerAnnouncement {
    /// Heard from within three heartbeat periods (by the reader's clock).
    pub fn is_alive(&self, now_ms: u64) -> bool {
        self.silence(now_ms)
            .is_some_and(|silence| silence <= self.heartbeat_every().saturating_mul(3))
    }

    /// Recent enough that calls may still be routed to its pool.
    pub fn is_routable(&self, now_ms: u64) -> bool {
        self.silence(now_ms).is_some_and(|silence| {
            silence <= ROUTABLE_SILENCE_MS.max(self.heartbeat_every().saturating_mul(3))
        })
    }

    /// How long the worker has been silent; `None` for a heartbeat too far in the future.
    fn silence(&self, now_ms: u64) -> Option<u64> {
        (self.heartbeat_ms <= now_ms.saturating_add(MAX_CLOCK_SKEW_MS))
            .then(|| now_ms.saturating_sub(self.heartbeat_ms))
    }

    fn heartbeat_every(&self) -> u64 {
        self.heartbeat_every_ms.min(MAX_HEARTBEAT_EVERY_MS)
    }

    /// Whether it runs subagent tasks of type `agent`.
    pub fn runs_agent(&self, agent: &str) -> bool {
        self.runs_subagents
            && self
                .agent_types
                .as_ref()
                .is_none_or(|types| types.iter().any(|t| t == agent))
    }

    /// Checks an entry read from the registry: anyone who can write there could have written it,
    /// so its names must be tokens and its tool and agent type lists bounded and well-formed.
    pub fn check(&self) -> Result<(), Failure> {
        validate_token("worker_id", &self.worker_id)?;
        validate_token("pool", &self.pool)?;
        if let Some(types) = &self.agent_types {
            if types.len() > MAX_ANNOUNCED_AGENT_TYPES {
                return Err(Failure::new(
                    FailureKind::InvalidInput,
                    format!("a worker may name at most {MAX_ANNOUNCED_AGENT_TYPES} agent types"),
                ));
            }
            for agent in types {
                validate_token("agent type", agent)?;
            }
        }
        if self.tools.len() > MAX_ANNOUNCED_TOOLS {
            return Err(Failure::new(
                FailureKind::InvalidInput,
                format!("a worker may offer at most {MAX_ANNOUNCED_TOOLS} tools"),
            ));
        }
        for tool in &self.tools {
            let name_ok = !tool.name.is_empty()
                && tool.name.len() <= MAX_TOKEN_LEN
                && tool
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !name_ok {
                return Err(Failure::new(
                    FailureKind::InvalidInput,
                    format!(
                        "tool name {:?} is not a token",
                        crate::text::cut(&tool.name, 64)
                    ),
                ));
            }
        }
        Ok(())
    }
}
