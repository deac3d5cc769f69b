//! `ShellConfig`: the operator's settings of the `shell` tool, every one settable by flag or
//! environment, checked by [`ShellConfig::validate`] before the worker starts.
//!
//! Invariants: a validated config has no zero limit, a memory limit bash can start under, an
//! output cap that fits the registry's output cap with room for the status lines, and an
//! environment allowlist of well-formed names none of which is one of the worker's own
//! `SKEIN_*` settings.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

pub const ENV_SHELL_MAX_TIMEOUT: &str = "SKEIN_SHELL_MAX_TIMEOUT";
pub const ENV_SHELL_MAX_OUTPUT: &str = "SKEIN_SHELL_MAX_OUTPUT";
pub const ENV_SHELL_CPU_SECONDS: &str = "SKEIN_SHELL_CPU_SECONDS";
pub const ENV_SHELL_MEMORY: &str = "SKEIN_SHELL_MEMORY";
pub const ENV_SHELL_MAX_PROCESSES: &str = "SKEIN_SHELL_MAX_PROCESSES";
pub const ENV_SHELL_ENV: &str = "SKEIN_SHELL_ENV";
pub const ENV_SHELL_NETWORK: &str = "SKEIN_SHELL_NETWORK";
pub const ENV_SHELL_READ_PATHS: &str = "SKEIN_SHELL_READ_PATHS";
pub const ENV_SHELL_UNISOLATED: &str = "SKEIN_SHELL_UNISOLATED";

/// Smallest address-space limit: bash itself needs a few MiB to start.
pub const MIN_MEMORY_BYTES: u64 = 16 * 1024 * 1024;

/// Room the status line, section headers, cut notes and the workspace summary need on top of
/// the captured output, inside the registry's output cap.
const FRAMING_BYTES: usize = 4 * 1024;

/// Largest output cap: what fits the registry's cap with the framing.
pub const MAX_OUTPUT_CAP: usize = super::super::DEFAULT_MAX_OUTPUT_BYTES - FRAMING_BYTES;

/// Settings of the `shell` tool (off unless `shell` is in the worker's tool list).
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ShellConfig {
    /// Longest wall time of one `shell` call (the call's `timeout_s` may ask for less); also the
    /// default. Kept below the worker's tool timeout, so a timed-out command still returns output.
    #[arg(id = "shell_max_timeout", long = "shell-max-timeout", env = ENV_SHELL_MAX_TIMEOUT, default_value = "50s", value_parser = humantime::parse_duration)]
    pub max_timeout: Duration,
    /// Most bytes of stdout and stderr together returned to the model (the head and the tail are
    /// kept, the middle cut).
    #[arg(id = "shell_max_output", long = "shell-max-output", env = ENV_SHELL_MAX_OUTPUT, default_value_t = 32 * 1024)]
    pub max_output: usize,
    /// CPU seconds each process of a command may use (RLIMIT_CPU).
    #[arg(id = "shell_cpu_seconds", long = "shell-cpu-seconds", env = ENV_SHELL_CPU_SECONDS, default_value_t = 60)]
    pub cpu_seconds: u64,
    /// Address space each process of a command may map (RLIMIT_AS): bytes, or with a suffix
    /// (`512MiB`, `4GiB`, `2G`; K, M and G are powers of 1024).
    #[arg(id = "shell_memory", long = "shell-memory", env = ENV_SHELL_MEMORY, default_value = "4GiB", value_parser = skein_common::workspace::parse_size)]
    pub memory_bytes: u64,
    /// Processes (and threads) a command may have at once (RLIMIT_NPROC; see the docs for
    /// what it counts).
    #[arg(id = "shell_max_processes", long = "shell-max-processes", env = ENV_SHELL_MAX_PROCESSES, default_value_t = 512)]
    pub max_processes: u64,
    /// Environment variables passed from the worker to commands, on top of PATH, LANG, LC_ALL,
    /// TZ and TERM (comma separated names).
    #[arg(id = "shell_env", long = "shell-env", env = ENV_SHELL_ENV, value_delimiter = ',')]
    pub env: Vec<String>,
    /// Let commands use the network (otherwise they run in an empty network namespace where
    /// the platform allows one).
    #[arg(id = "shell_network", long = "shell-network", env = ENV_SHELL_NETWORK, default_value_t = false, action = clap::ArgAction::Set)]
    pub network: bool,
    /// More paths commands may read and run from (a toolchain outside the system's paths),
    /// comma-separated; the system's own are always readable.
    #[arg(id = "shell_read_paths", long = "shell-read-paths", env = ENV_SHELL_READ_PATHS, value_delimiter = ',')]
    pub read_paths: Vec<PathBuf>,
    /// What happens where neither Landlock nor user namespaces work, so a command could reach
    /// every file of the worker's user: `refuse` (the default: the tool answers that it cannot
    /// run commands here) or `allow` (they run, with a warning at start and on every call).
    #[arg(id = "shell_unisolated", long = "shell-unisolated", env = ENV_SHELL_UNISOLATED, value_enum, default_value_t = Unisolated::Refuse)]
    pub unisolated: Unisolated,
}

/// Whether commands run where they cannot be isolated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Unisolated {
    #[default]
    Refuse,
    Allow,
}

impl Default for ShellConfig {
    /// The same values as the flags' defaults.
    fn default() -> Self {
        Self {
            max_timeout: Duration::from_secs(50),
            max_output: 32 * 1024,
            cpu_seconds: 60,
            memory_bytes: 4 * 1024 * 1024 * 1024,
            max_processes: 512,
            env: Vec::new(),
            network: false,
            read_paths: Vec::new(),
            unisolated: Unisolated::Refuse,
        }
    }
}

impl ShellConfig {
    /// Checks values clap cannot; the message names the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_timeout < Duration::from_secs(1) {
            return Err(format!(
                "shell max timeout ({ENV_SHELL_MAX_TIMEOUT}) must be at least 1s"
            ));
        }
        if self.max_output == 0 || self.max_output > MAX_OUTPUT_CAP {
            return Err(format!(
                "shell max output ({ENV_SHELL_MAX_OUTPUT}) must be between 1 and {MAX_OUTPUT_CAP} bytes"
            ));
        }
        if self.cpu_seconds == 0 {
            return Err(format!(
                "shell cpu seconds ({ENV_SHELL_CPU_SECONDS}) must be at least 1"
            ));
        }
        if self.memory_bytes < MIN_MEMORY_BYTES {
            return Err(format!(
                "shell memory ({ENV_SHELL_MEMORY}) must be at least {}MiB",
                MIN_MEMORY_BYTES / (1024 * 1024)
            ));
        }
        if self.max_processes == 0 {
            return Err(format!(
                "shell max processes ({ENV_SHELL_MAX_PROCESSES}) must be at least 1"
            ));
        }
        for name in self.env_names() {
            if !is_env_name(name) {
                return Err(format!(
                    "shell env ({ENV_SHELL_ENV}): {name:?} is not a variable name"
                ));
            }
            if name.starts_with("SKEIN_") {
                return Err(format!(
                    "shell env ({ENV_SHELL_ENV}): {name} is a worker setting and is never passed to commands"
                ));
            }
        }
        Ok(())
    }

    /// The configured extra variable names (empty entries of the list ignored).
    pub fn env_names(&self) -> impl Iterator<Item = &str> {
        self.env.iter().map(|n| n.trim()).filter(|n| !n.is_empty())
    }
}

/// `[A-Za-z_][A-Za-z0-9_]*`.
fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        shell: ShellConfig,
    }

    fn parsed(flags: &[&str]) -> Result<ShellConfig, String> {
        let mut args = vec!["test"];
        args.extend_from_slice(flags);
        Flags::try_parse_from(args)
            .map(|f| f.shell)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_match_the_flags_and_validate() {
        let parsed = parsed(&[]).expect("defaults parse");
        // The environment of the test run could set these; only compare when it does not.
        if std::env::vars().all(|(k, _)| !k.starts_with("SKEIN_SHELL_")) {
            assert_eq!(parsed, ShellConfig::default());
        }
        assert_eq!(ShellConfig::default().validate(), Ok(()));
    }

    #[test]
    fn zero_and_bad_limits_are_refused_with_the_setting_named() {
        let cases: [(&[&str], &str); 9] = [
            (&["--shell-max-timeout", "0s"], ENV_SHELL_MAX_TIMEOUT),
            (&["--shell-max-output", "0"], ENV_SHELL_MAX_OUTPUT),
            (&["--shell-max-output", "1000000"], ENV_SHELL_MAX_OUTPUT),
            (&["--shell-cpu-seconds", "0"], ENV_SHELL_CPU_SECONDS),
            (&["--shell-memory", "0"], ENV_SHELL_MEMORY),
            (&["--shell-memory", "1MiB"], ENV_SHELL_MEMORY),
            (&["--shell-max-processes", "0"], ENV_SHELL_MAX_PROCESSES),
            (&["--shell-env", "GOOD,bad name"], ENV_SHELL_ENV),
            (&["--shell-env", "SKEIN_NATS_PASSWORD"], ENV_SHELL_ENV),
        ];
        for (flags, setting) in cases {
            let error = parsed(flags)
                .expect("parses")
                .validate()
                .expect_err("refused");
            assert!(error.contains(setting), "{flags:?}: {error}");
        }
    }

    #[test]
    fn settings_parse() {
        let cfg = parsed(&[
            "--shell-max-timeout",
            "5s",
            "--shell-memory",
            "512MiB",
            "--shell-env",
            "GOPATH, CARGO_HOME,",
            "--shell-network",
            "true",
        ])
        .expect("parses");
        assert_eq!(cfg.max_timeout, Duration::from_secs(5));
        assert_eq!(cfg.memory_bytes, 512 * 1024 * 1024);
        assert_eq!(
            cfg.env_names().collect::<Vec<_>>(),
            ["GOPATH", "CARGO_HOME"]
        );
        assert!(cfg.network);
        assert_eq!(cfg.validate(), Ok(()));
    }
}
