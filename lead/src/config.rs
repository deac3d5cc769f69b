//! The lead's configuration: one clap struct, every field settable by flag or environment.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use skein_common::config::*;
use skein_common::protocol::validate_token;

/// `skein-lead`: runs agent turns.
#[derive(Debug, Clone, Parser)]
#[command(name = "skein-lead", version, about)]
pub struct Config {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[command(flatten)]
    pub redis: RedisConfig,
    #[command(flatten)]
    pub model: ModelConfig,
    /// Workspace folder with AGENTS.md, subagents/ and skills/; the bundled example when unset.
    #[arg(long, env = ENV_AGENTS_DIR)]
    pub agents_dir: Option<PathBuf>,
    /// Turns run at once by this lead.
    #[arg(long, env = ENV_CONCURRENCY, default_value_t = 64)]
    pub concurrency: usize,
    /// Cap on message payloads (and on a task's input).
    #[arg(long, env = ENV_MAX_PAYLOAD, default_value_t = skein_common::bus::DEFAULT_MAX_PAYLOAD)]
    pub max_payload: usize,
    /// Longest one tool call may run.
    #[arg(long, env = ENV_TOOL_TIMEOUT, default_value = "60s", value_parser = humantime::parse_duration)]
    pub tool_timeout: Duration,
    /// Longest one subagent call may run.
    #[arg(long, env = ENV_SUBAGENT_TIMEOUT, default_value = "300s", value_parser = humantime::parse_duration)]
    pub subagent_timeout: Duration,
    /// Time running turns get to finish on SIGTERM before they are handed back.
    #[arg(long, env = ENV_GRACE, default_value = "30s", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// How long a submitted task may go unacknowledged (progress acks extend it while it runs).
    #[arg(long, env = ENV_ACK_WAIT, default_value = "30s", value_parser = humantime::parse_duration)]
    pub ack_wait: Duration,
    /// Deliveries of a task before the broker gives up on it.
    #[arg(long, env = ENV_MAX_DELIVER, default_value_t = 5)]
    pub max_deliver: i64,
    /// How long a session lease lasts without renewal (a dead lead's lease frees after this).
    #[arg(long, env = ENV_LEASE_TTL, default_value = "30s", value_parser = humantime::parse_duration)]
    pub lease_ttl: Duration,
    /// Unique id of this process; random when unset.
    #[arg(long, env = ENV_INSTANCE_ID)]
    pub instance_id: Option<String>,
}

impl Config {
    /// Checks values clap cannot.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(id) = &self.instance_id {
            validate_token("instance id", id).map_err(|f| f.message)?;
        }
        if self.concurrency == 0 {
            return Err("concurrency must be at least 1".into());
        }
        if self.ack_wait < Duration::from_secs(1) || self.lease_ttl < Duration::from_secs(1) {
            return Err("ack wait and lease ttl must be at least 1s".into());
        }
        if self.max_deliver < 1 {
            return Err("max deliver must be at least 1".into());
        }
        Ok(())
    }
}
