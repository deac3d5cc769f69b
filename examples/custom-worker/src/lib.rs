//! Two tools of a worker of your own.
//!
//! - [`WordCount`] (read-only): counts the words of a text.
//! - [`Ledger`] (destructive): appends an entry to a ledger file, once per call. It uses the
//!   call's idempotency key, the same on every run of the call, so a call that runs twice (its
//!   first worker died after writing) is written once; and it stages the entry in the call's
//!   scratch directory, which the worker removes when the call ends, whatever the outcome.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Deserialize;
use skein_worker::tools::{Tool, ToolContext, ToolEffects, ToolError};

/// Environment variable naming the ledger file.
pub const ENV_LEDGER_FILE: &str = "LEDGER_FILE";

/// Counts the words of a text.
pub struct WordCount;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WordCountArgs {
    /// The text whose words are counted.
    pub text: String,
}

impl Tool for WordCount {
    const NAME: &'static str = "word_count";
    type Args = WordCountArgs;

    fn description(&self) -> String {
        "Count the words of a text.".into()
    }

    fn effects(&self) -> ToolEffects {
        ToolEffects::READ_ONLY
    }

    async fn call(&self, args: WordCountArgs, _ctx: ToolContext<'_>) -> Result<String, ToolError> {
        Ok(format!("{} words", args.text.split_whitespace().count()))
    }
}

/// Appends entries to a ledger file, each call's once.
pub struct Ledger {
    file: PathBuf,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LedgerArgs {
    /// What the entry records (one line).
    pub entry: String,
    /// Amount in cents; must not be negative.
    pub cents: u64,
}

impl Ledger {
    pub fn new(file: impl Into<PathBuf>) -> Self {
        Self { file: file.into() }
    }

    /// The ledger named by `LEDGER_FILE`, else `ledger.tsv` in the working directory.
    pub fn from_env() -> Self {
        Self::new(std::env::var_os(ENV_LEDGER_FILE).unwrap_or_else(|| "ledger.tsv".into()))
    }

    /// The ledger's lines as `(idempotency key, entry, cents)`.
    pub fn entries(&self) -> std::io::Result<Vec<(String, String, u64)>> {
        let text = match std::fs::read_to_string(&self.file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        Ok(text
            .lines()
            .filter_map(|line| {
                let mut fields = line.splitn(3, '\t');
                let key = fields.next()?.to_owned();
                let cents = fields.next()?.parse().ok()?;
                let entry = fields.next()?.to_owned();
                Some((key, entry, cents))
            })
            .collect())
    }
}

impl Tool for Ledger {
    const NAME: &'static str = "ledger_append";
    type Args = LedgerArgs;

    fn description(&self) -> String {
        "Append an entry with an amount in cents to the ledger.".into()
    }

    fn effects(&self) -> ToolEffects {
        ToolEffects::DESTRUCTIVE
    }

    fn concurrency_safe(&self) -> bool {
        false
    }

    async fn call(&self, args: LedgerArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        if args.entry.contains(['\n', '\t']) {
            return Err(ToolError::InvalidArguments(
                "entry must be one line without tabs".into(),
            ));
        }
        let io = |e: std::io::Error| ToolError::Failed(format!("ledger: {e}"));
        let key = ctx.idempotency_key;
        if self.entries().map_err(io)?.iter().any(|(k, _, _)| k == key) {
            return Ok(format!("already recorded: {}", args.entry));
        }
        // Staged in the call's own scratch directory (removed when the call ends), then
        // appended in one write.
        let staging = ctx
            .scope
            .scratch_dir()
            .await
            .map_err(|e| ToolError::Failed(e.to_string()))?
            .join("entry");
        let line = format!("{key}\t{}\t{}\n", args.cents, args.entry);
        tokio::fs::write(&staging, &line).await.map_err(io)?;
        let staged = tokio::fs::read(&staging).await.map_err(io)?;
        append(&self.file, &staged).await.map_err(io)?;
        Ok(format!("recorded: {} ({} cents)", args.entry, args.cents))
    }
}

async fn append(file: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut ledger = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .await?;
    ledger.write_all(bytes).await?;
    ledger.flush().await
}
