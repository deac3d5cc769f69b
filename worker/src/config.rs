//! The worker's configuration: one clap struct, every field settable by flag or environment.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use skein_common::config::*;
use skein_common::protocol::validate_token;

use crate::tools::http::ENV_HTTP_ALLOW_PRIVATE;

/// Tools a worker provides when none are configured.
pub const DEFAULT_TOOLS: &str =
    "read_file,write_file,edit_file,list_files,glob_files,grep_files,http_fetch";

/// `skein-worker`: runs tool and subagent tasks for one pool.
#[derive(Debug, Clone, Parser)]
#[command(name = "skein-worker", version, about)]
pub struct Config {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[command(flatten)]
    pub redis: RedisConfig,
    /// Model used by subagent loops run on this worker.
    #[command(flatten)]
    pub model: ModelConfig,
    #[command(flatten)]
    pub process: ProcessConfig,
    #[command(flatten)]
    pub telemetry: skein_common::telemetry::TelemetryConfig,
    #[command(flatten)]
    pub admin: skein_common::admin::AdminConfig,
    #[command(flatten)]
    pub workspace: crate::workspace::WorkspaceConfig,
    #[command(flatten)]
    pub shell: crate::tools::shell::ShellConfig,
    #[command(flatten)]
    pub mcp: crate::mcp::McpConfig,
    /// Pool this worker serves; workers of one pool share one consumer and must provide the same tools.
    #[arg(long, env = ENV_POOL, default_value = "default")]
    pub pool: String,
    /// Tools this worker provides (comma separated).
    #[arg(long, env = ENV_TOOLS, default_value = DEFAULT_TOOLS, value_delimiter = ',')]
    pub tools: Vec<String>,
    /// Whether this worker runs subagent tasks.
    #[arg(long, env = ENV_SUBAGENTS, default_value_t = true, action = clap::ArgAction::Set)]
    pub subagents: bool,
    /// Tasks run at once (tool tasks and subagent tasks each).
    #[arg(long, env = ENV_CONCURRENCY, default_value_t = 8)]
    pub concurrency: usize,
    /// Root of session workspaces (`<root>/<tenant>/<session>`); shared by the pool's workers.
    #[arg(long, env = ENV_WORKSPACE_ROOT)]
    pub workspace_root: Option<PathBuf>,
    /// Where task scopes create scratch directories.
    #[arg(long, env = ENV_SCRATCH_DIR)]
    pub scratch_dir: Option<PathBuf>,
    /// Hosts `http_fetch` and `http_request` may reach (comma separated; `*.example.com`
    /// patterns; `*` for any). An IP literal also allows that address when it is private.
    #[arg(long, env = ENV_HTTP_ALLOW, value_delimiter = ',')]
    pub http_allow: Vec<String>,
    /// Let the HTTP tools reach loopback, private, link-local (cloud metadata) and other
    /// non-public addresses; off, only the ones `http_allow` names literally.
    #[arg(long, env = ENV_HTTP_ALLOW_PRIVATE, default_value_t = false, action = clap::ArgAction::Set)]
    pub http_allow_private: bool,
    /// Largest body `http_fetch` returns.
    #[arg(long, env = ENV_HTTP_MAX_BYTES, default_value_t = 256 * 1024)]
    pub http_max_bytes: usize,
    /// Longest a subagent task may run here, whatever its task asks for.
    #[arg(long, env = ENV_SUBAGENT_TIMEOUT, default_value = "300s", value_parser = humantime::parse_duration)]
    pub subagent_timeout: Duration,
    /// How often the worker announces itself.
    #[arg(long, env = ENV_HEARTBEAT, default_value = "2s", value_parser = humantime::parse_duration)]
    pub heartbeat: Duration,
}

/// Shortest announcement interval (the registry's liveness window is a few of them).
const MIN_HEARTBEAT: Duration = Duration::from_millis(100);

impl Config {
    /// Checks values clap cannot.
    pub fn validate(&self) -> Result<(), String> {
        validate_token("pool", &self.pool).map_err(|f| f.message)?;
        self.process.validate()?;
        self.nats.validate()?;
        self.redis.validate()?;
        self.model.validate()?;
        self.telemetry.validate()?;
        self.admin.validate()?;
        self.workspace.validate()?;
        self.shell.validate()?;
        if self.concurrency == 0 {
            return Err("concurrency must be at least 1".into());
        }
        if let Some(unknown) = self
            .tools()
            .find(|t| !crate::tools::BUILTIN_TOOLS.contains(t))
        {
            return Err(format!(
                "unknown tool {unknown:?}; available: {}",
                crate::tools::BUILTIN_TOOLS.join(", ")
            ));
        }
        if self.heartbeat < MIN_HEARTBEAT {
            return Err(format!("heartbeat must be at least {MIN_HEARTBEAT:?}"));
        }
        let longest = Duration::from_millis(skein_common::protocol::MAX_HEARTBEAT_EVERY_MS);
        if self.heartbeat > longest {
            return Err(format!("heartbeat must be at most {longest:?}"));
        }
        if self.subagent_timeout < Duration::from_secs(1) {
            return Err("subagent timeout must be at least 1s".into());
        }
        Ok(())
    }

    /// The configured tool names (empty entries of the list ignored).
    pub fn tools(&self) -> impl Iterator<Item = &str> {
        self.tools
            .iter()
            .map(|t| t.trim())
            .filter(|t| !t.is_empty())
    }

    pub fn workspace_root(&self) -> PathBuf {
        self.workspace_root
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("skein").join("workspaces"))
    }

    pub fn scratch_dir(&self) -> PathBuf {
        self.scratch_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("skein").join("scratch"))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::Config;

    fn validated(flags: &[&str]) -> Result<(), String> {
        let mut args = vec!["skein-worker"];
        args.extend_from_slice(flags);
        Config::try_parse_from(args)
            .map_err(|e| e.to_string())?
            .validate()
    }

    #[test]
    fn zero_intervals_are_refused_with_the_setting_named() {
        assert!(validated(&[]).is_ok());
        let heartbeat = validated(&["--heartbeat", "0s"]).expect_err("refused");
        assert!(heartbeat.contains("heartbeat"), "{heartbeat}");
        let timeout = validated(&["--subagent-timeout", "0s"]).expect_err("refused");
        assert!(timeout.contains("subagent timeout"), "{timeout}");
        let tool = validated(&["--tool-timeout", "0s"]).expect_err("refused");
        assert!(tool.contains("tool timeout"), "{tool}");
    }
}
