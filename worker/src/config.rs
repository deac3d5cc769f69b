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
    /// Which subagent tasks this worker runs: `true` (every type, one consumer for the pool),
    /// `false` (none), or agent names, comma separated (only those, one consumer per type).
    /// Workers of one pool must be configured alike.
    #[arg(long, env = ENV_SUBAGENTS, default_value = "true", value_parser = SubagentTypes::parse)]
    pub subagents: SubagentTypes,
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

/// Which subagent types a worker runs (`SKEIN_SUBAGENTS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubagentTypes {
    /// No subagent tasks: no agent consumer.
    None,
    /// Every type, through the pool's one agent consumer (`skein-agents-{pool}`).
    All,
    /// These types only (sorted, without duplicates), through one consumer each
    /// (`skein-agents-{pool}~{agent}`).
    Only(Vec<String>),
}

impl SubagentTypes {
    /// `true`, `false`, or a comma-separated list of agent names. Words that read as a yes or a
    /// no (`yes`, `no`, `on`, `off`, `1`, `0`) are refused rather than taken for agent names.
    pub fn parse(value: &str) -> Result<Self, String> {
        let value = value.trim();
        if value.eq_ignore_ascii_case("true") {
            return Ok(Self::All);
        }
        if value.eq_ignore_ascii_case("false") {
            return Ok(Self::None);
        }
        let mut types = Vec::new();
        for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if ["yes", "no", "on", "off", "1", "0"]
                .iter()
                .any(|word| name.eq_ignore_ascii_case(word))
            {
                return Err(format!(
                    "{name:?} is not a subagent setting: say true or false, or list agent names"
                ));
            }
            validate_token("agent name", name).map_err(|f| f.message)?;
            types.push(name.to_owned());
        }
        if types.is_empty() {
            return Err("say true or false, or list agent names (comma separated)".into());
        }
        if types.len() > skein_common::protocol::MAX_ANNOUNCED_AGENT_TYPES {
            return Err(format!(
                "at most {} agent types",
                skein_common::protocol::MAX_ANNOUNCED_AGENT_TYPES
            ));
        }
        types.sort();
        types.dedup();
        Ok(Self::Only(types))
    }

    /// Whether it runs any subagent task.
    pub fn any(&self) -> bool {
        !matches!(self, Self::None)
    }

    /// The types it names, as announced (`None` for every type, or for none).
    pub fn listed(&self) -> Option<Vec<String>> {
        match self {
            Self::Only(types) => Some(types.clone()),
            Self::None | Self::All => None,
        }
    }
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
    fn subagents_take_a_yes_a_no_or_a_list_of_agent_types() {
        use super::SubagentTypes;
        let parsed = |flag: &str| {
            Config::try_parse_from(["skein-worker", "--subagents", flag])
                .map(|c| c.subagents)
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            Config::try_parse_from(["skein-worker"])
                .map(|c| c.subagents)
                .ok(),
            Some(SubagentTypes::All)
        );
        assert_eq!(parsed("true"), Ok(SubagentTypes::All));
        assert_eq!(parsed("false"), Ok(SubagentTypes::None));
        assert_eq!(
            parsed("writer, researcher,,writer"),
            Ok(SubagentTypes::Only(vec![
                "researcher".into(),
                "writer".into()
            ]))
        );
        for bad in ["", "no", "researcher,off", "a.b", "a b"] {
            assert!(parsed(bad).is_err(), "{bad:?} accepted");
        }
        assert!(!SubagentTypes::None.any());
        assert_eq!(SubagentTypes::All.listed(), None);
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
