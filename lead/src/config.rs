//! The lead's configuration: one clap struct, every field settable by flag or environment.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use skein_common::config::*;

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
    #[command(flatten)]
    pub process: ProcessConfig,
    #[command(flatten)]
    pub telemetry: skein_common::telemetry::TelemetryConfig,
    #[command(flatten)]
    pub admin: skein_common::admin::AdminConfig,
    /// Workspace folder with AGENTS.md, subagents/ and skills/; the bundled example when unset.
    #[arg(long, env = ENV_AGENTS_DIR)]
    pub agents_dir: Option<PathBuf>,
    /// Turns run at once by this lead.
    #[arg(long, env = ENV_CONCURRENCY, default_value_t = 64)]
    pub concurrency: usize,
    /// Longest one subagent call may run.
    #[arg(long, env = ENV_SUBAGENT_TIMEOUT, default_value = "300s", value_parser = humantime::parse_duration)]
    pub subagent_timeout: Duration,
    /// How long a session lease lasts without renewal (a dead lead's lease frees after this).
    #[arg(long, env = ENV_LEASE_TTL, default_value = "30s", value_parser = humantime::parse_duration)]
    pub lease_ttl: Duration,
}

impl Config {
    /// Checks values clap cannot.
    pub fn validate(&self) -> Result<(), String> {
        self.process.validate()?;
        self.nats.validate()?;
        self.redis.validate()?;
        self.model.validate()?;
        self.telemetry.validate()?;
        self.admin.validate()?;
        if self.concurrency == 0 {
            return Err("concurrency must be at least 1".into());
        }
        if self.lease_ttl < Duration::from_secs(1) {
            return Err("lease ttl must be at least 1s".into());
        }
        if self.subagent_timeout < Duration::from_secs(1) {
            return Err("subagent timeout must be at least 1s".into());
        }
        Ok(())
    }
}
