//! `skein audit`: the audit trail (`SKEIN_AUDIT`, see `skein_common::audit`) read back, oldest
//! first, filtered by tenant, principal, task and time; one line per record (time, tenant,
//! principal and how it is known, action, task, target, verdict, reason), or one JSON object per
//! line with `--json`.
//!
//! Invariant: a tenant principal (see `principal`) reads only its own tenant's records: the
//! tenant filter is forced to its tenant, and asking for another is an error, not an empty list.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use skein_common::audit::{AuditFilter, AuditRecord, Verdict};
use skein_common::client::SkeinClient;
use skein_common::config::NatsConfig;
use skein_common::principals::EVERY_TENANT;
use skein_common::protocol::validate_token;

use super::principal::Caller;

#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub nats: NatsConfig,
    /// Only this tenant's records (`*`: the records of no one tenant, such as a whole purge).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only the records of this principal.
    #[arg(long)]
    pub principal: Option<String>,
    /// Only the records of this task.
    #[arg(long = "task", value_name = "TASK_ID")]
    pub task_id: Option<String>,
    /// Only records from then on: a duration ago (`1h`, `30m`, `7days`) or an RFC 3339 time in
    /// UTC (`2025-01-31T12:00:00Z`).
    #[arg(long, value_parser = parse_instant)]
    pub since: Option<u64>,
    /// Only records until then: a duration ago or an RFC 3339 time in UTC.
    #[arg(long, value_parser = parse_instant)]
    pub until: Option<u64>,
    /// At most this many records (the oldest that match).
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    /// One JSON record per line.
    #[arg(long)]
    pub json: bool,
}

pub async fn audit(args: AuditArgs) -> ExitCode {
    super::exit_code(run(args).await)
}

async fn run(args: AuditArgs) -> Result<(), String> {
    if args.limit == 0 {
        return Err("--limit must be at least 1".into());
    }
    if let (Some(since), Some(until)) = (args.since, args.until) {
        if since > until {
            return Err("--since is later than --until: no record can match".into());
        }
    }
    if let Some(tenant) = args.tenant.as_deref().filter(|t| *t != EVERY_TENANT) {
        validate_token("tenant", tenant).map_err(|f| f.message)?;
    }
    let client = SkeinClient::connect(&args.nats)
        .await
        .map_err(|e| e.to_string())?;
    let caller = Caller::of(client.bus())?;
    let filter = AuditFilter {
        tenant: scoped_tenant(&caller, args.tenant)?,
        principal: args.principal,
        task_id: args.task_id,
        since_ms: args.since,
        until_ms: args.until,
    };
    let records = client
        .bus()
        .audit_records(&filter, args.limit)
        .await
        .map_err(|e| format!("cannot read the audit trail: {e}"))?;
    if records.is_empty() {
        eprintln!("no audit records match");
    }
    let mut out = String::new();
    for record in &records {
        if args.json {
            out.push_str(&serde_json::to_string(record).map_err(|e| e.to_string())?);
        } else {
            out.push_str(&line(record));
        }
        out.push('\n');
    }
    print!("{out}");
    Ok(())
}

/// The tenant filter: a tenant principal's own tenant, whatever was asked (another is an error).
fn scoped_tenant(caller: &Caller, asked: Option<String>) -> Result<Option<String>, String> {
    match (caller.tenant(), asked) {
        (None, asked) => Ok(asked),
        (Some(own), Some(asked)) if asked != own => Err(format!(
            "{} belongs to tenant {own} and may not read the audit records of tenant {asked}",
            caller.name()
        )),
        (Some(own), _) => Ok(Some(own.to_owned())),
    }
}

/// A record on one line, tab-separated; `-` for what it does not name.
fn line(record: &AuditRecord) -> String {
    let at = humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(record.at_ms));
    let or_dash = |text: &str| match text {
        "" => "-".to_owned(),
        text => text.replace(['\t', '\n', '\r'], " "),
    };
    let verdict = match record.verdict {
        Verdict::Done => "done",
        Verdict::Refused => "refused",
    };
    format!(
        "{at}\t{}\t{} ({})\t{}\t{}\t{}\t{verdict}\t{}",
        or_dash(&record.tenant),
        or_dash(&record.principal),
        record.proof,
        record.action,
        or_dash(&record.task_id),
        or_dash(&record.target),
        record.reason.replace(['\t', '\n', '\r'], " ")
    )
}

/// A time on the command line as unix milliseconds: a duration ago, or an RFC 3339 time in UTC.
fn parse_instant(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let at = match humantime::parse_duration(text) {
        Ok(ago) => SystemTime::now()
            .checked_sub(ago)
            .ok_or_else(|| format!("{text} ago is before the Unix epoch"))?,
        Err(_) => humantime::parse_rfc3339_weak(text).map_err(|_| {
            format!(
                "expected a duration ago (1h, 30m, 7days) or an RFC 3339 time in UTC (2025-01-31T12:00:00Z), not {text:?}"
            )
        })?,
    };
    let ms = at
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("{text} is before the Unix epoch"))?
        .as_millis();
    u64::try_from(ms).map_err(|_| format!("{text} is too far in the future"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_a_duration_ago_or_an_rfc3339_time() {
        assert_eq!(parse_instant("2025-01-31T12:00:00Z"), Ok(1_738_324_800_000));
        let before = skein_common::protocol::now_ms();
        let hour_ago = parse_instant("1h").expect("a duration");
        let after = skein_common::protocol::now_ms();
        assert!(
            (before - 3_600_000..=after - 3_600_000).contains(&hour_ago),
            "1h ago read as {hour_ago}, not between {before} and {after} less an hour"
        );
        assert!(parse_instant("yesterday").is_err());
    }

    #[test]
    fn a_record_is_one_line_with_a_dash_for_what_it_does_not_name() {
        let record = AuditRecord {
            at_ms: 1_738_324_800_000,
            tenant: "acme".into(),
            principal: "alice".into(),
            proof: "signed".into(),
            action: "dlq_replay".into(),
            task_id: String::new(),
            target: "7".into(),
            verdict: Verdict::Done,
            reason: "two\nlines".into(),
        };
        assert_eq!(
            line(&record),
            "2025-01-31T12:00:00.000Z\tacme\talice (signed)\tdlq_replay\t-\t7\tdone\ttwo lines"
        );
    }
}
