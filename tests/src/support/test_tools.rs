//! Tools that exist only in tests and benchmarks: a slow tool whose side effect is counted (to see
//! which calls ran more than once after a crash), a tool that kills its worker process (a poison
//! task), a tool that does nothing (the cost of the path around a tool), and tools that fail and
//! panic (the soak's bad outcomes).
//! `skein-node test-worker ...` runs a real worker process that provides them next to the
//! built-in tools.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use skein_worker::tools::{Tool, ToolContext, ToolError, ToolRegistry};

/// Environment variable naming the file `slow_effect` appends its effects to.
pub const EFFECTS_FILE_ENV: &str = "SKEIN_TEST_EFFECTS";

/// Adds the test tools to a worker's registry.
pub fn register(registry: &mut ToolRegistry, effects: PathBuf) {
    registry.register(SlowEffect { effects });
    registry.register(CrashWorker);
    registry.register(Noop);
    registry.register(FailAlways);
    registry.register(PanicAlways);
    registry.register(BigOutput);
}

/// Answers with `bytes` bytes: `HEAD`, filler lines, `TAIL` (test tool).
pub struct BigOutput;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BigOutputArgs {
    /// Size of the answer in bytes (at least 8).
    pub bytes: usize,
}

impl Tool for BigOutput {
    const NAME: &'static str = "big_output";
    type Args = BigOutputArgs;

    fn description(&self) -> String {
        "Answers with a large text (test tool).".into()
    }

    async fn call(&self, args: BigOutputArgs, _ctx: ToolContext<'_>) -> Result<String, ToolError> {
        let filler = args.bytes.saturating_sub(8);
        let line =
            "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456\n";
        let mut output = String::with_capacity(args.bytes);
        output.push_str("HEAD");
        while output.len() < 4 + filler {
            let left = 4 + filler - output.len();
            output.push_str(&line[..left.min(line.len())]);
        }
        output.push_str("TAIL");
        Ok(output)
    }
}

/// Fails with its message (test tool).
pub struct FailAlways;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FailArgs {
    /// What the failure says.
    #[serde(default)]
    pub message: String,
}

impl Tool for FailAlways {
    const NAME: &'static str = "fail";
    type Args = FailArgs;

    fn description(&self) -> String {
        "Fails (test tool).".into()
    }

    async fn call(&self, args: FailArgs, _ctx: ToolContext<'_>) -> Result<String, ToolError> {
        Err(ToolError::Failed(args.message))
    }
}

/// Panics after opening a scratch directory in its scope (test tool): the scope must still close.
pub struct PanicAlways;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PanicArgs {}

impl Tool for PanicAlways {
    const NAME: &'static str = "panic";
    type Args = PanicArgs;

    fn description(&self) -> String {
        "Panics (test tool).".into()
    }

    async fn call(&self, _args: PanicArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        let scratch = ctx
            .scope
            .scratch_dir()
            .await
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        panic!("test tool panicked with {} open", scratch.display())
    }
}

/// Does nothing and answers at once: the cost of the path around a tool (test and bench tool).
pub struct Noop;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoopArgs {}

impl Tool for Noop {
    const NAME: &'static str = "noop";
    type Args = NoopArgs;

    fn description(&self) -> String {
        "Does nothing (test tool).".into()
    }

    async fn call(&self, _args: NoopArgs, _ctx: ToolContext<'_>) -> Result<String, ToolError> {
        Ok("ok".into())
    }
}

/// Waits, recording when it starts and when it is done: a side effect that can be counted.
pub struct SlowEffect {
    effects: PathBuf,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SlowEffectArgs {
    /// Names the effect.
    pub key: String,
    /// How long the tool works, in milliseconds.
    pub ms: u64,
}

impl Tool for SlowEffect {
    const NAME: &'static str = "slow_effect";
    type Args = SlowEffectArgs;

    fn description(&self) -> String {
        "Works for a while and records that it did (test tool).".into()
    }

    async fn call(&self, args: SlowEffectArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        let line = |what: &str| {
            format!(
                "{what}\t{}\t{}\t{}\n",
                args.key, ctx.origin.task_id, ctx.call_id
            )
        };
        append(&self.effects, &line("start")).map_err(|e| ToolError::Failed(e.to_string()))?;
        tokio::time::sleep(Duration::from_millis(args.ms)).await;
        append(&self.effects, &line("done")).map_err(|e| ToolError::Failed(e.to_string()))?;
        Ok(format!("effect {} done", args.key))
    }
}

/// Kills the worker process that runs it (test tool).
pub struct CrashWorker;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CrashWorkerArgs {}

impl Tool for CrashWorker {
    const NAME: &'static str = "crash_worker";
    type Args = CrashWorkerArgs;

    fn description(&self) -> String {
        "Kills the worker that runs it (test tool).".into()
    }

    async fn call(
        &self,
        _args: CrashWorkerArgs,
        _ctx: ToolContext<'_>,
    ) -> Result<String, ToolError> {
        std::process::abort()
    }
}

fn append(path: &Path, line: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(line.as_bytes())
}

/// Counts of one effect key in an effects file.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EffectCount {
    pub started: usize,
    pub done: usize,
}

/// Reads an effects file: per key, how often the effect started and finished.
pub fn read_effects(path: &Path) -> std::collections::BTreeMap<String, EffectCount> {
    let mut counts = std::collections::BTreeMap::<String, EffectCount>::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let mut fields = line.split('\t');
        let (Some(what), Some(key)) = (fields.next(), fields.next()) else {
            continue;
        };
        let entry = counts.entry(key.to_owned()).or_default();
        match what {
            "start" => entry.started += 1,
            "done" => entry.done += 1,
            _ => {}
        }
    }
    counts
}
