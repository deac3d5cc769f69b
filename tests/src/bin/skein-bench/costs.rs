//! What one unit of work (a turn, a call) costs each part of the cluster: CPU time of the lead
//! (or the process acting as it), the workers, `nats-server` and `redis-server`, and Redis
//! commands and bytes. Counters are read before and after a run and the difference is divided by
//! the units the run completed; these are the inputs of the capacity model (docs/CAPACITY.md).

use redis::aio::MultiplexedConnection;

use crate::report::Report;
use crate::Failed;

/// Clock ticks per second of `/proc/{pid}/stat`'s CPU times (`USER_HZ`, 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// The processes whose CPU a unit of work is charged to.
pub(crate) struct Parts {
    pub(crate) lead: u32,
    pub(crate) workers: Vec<u32>,
    pub(crate) nats: Option<u32>,
    pub(crate) redis: Option<u32>,
}

/// Counters at one moment.
pub(crate) struct Snapshot {
    lead_cpu: f64,
    workers_cpu: f64,
    nats_cpu: f64,
    redis_cpu: f64,
    redis: RedisCounters,
}

#[derive(Default)]
struct RedisCounters {
    commands: f64,
    bytes_in: f64,
    bytes_out: f64,
}

impl Parts {
    pub(crate) async fn snapshot(
        &self,
        redis: &mut MultiplexedConnection,
    ) -> Result<Snapshot, Failed> {
        Ok(Snapshot {
            lead_cpu: cpu_seconds(self.lead)?,
            workers_cpu: self
                .workers
                .iter()
                .map(|&pid| cpu_seconds(pid))
                .sum::<Result<f64, Failed>>()?,
            nats_cpu: self.nats.map(cpu_seconds).transpose()?.unwrap_or(0.0),
            redis_cpu: self.redis.map(cpu_seconds).transpose()?.unwrap_or(0.0),
            redis: redis_counters(redis).await?,
        })
    }
}

/// Adds `cost per {unit}: …` figures for the work done between `before` and `after`.
pub(crate) fn report_costs(
    report: &mut Report,
    unit: &str,
    units: usize,
    before: &Snapshot,
    after: &Snapshot,
) {
    let per = |a: f64, b: f64| (b - a) / units.max(1) as f64;
    let cpu = [
        ("lead", before.lead_cpu, after.lead_cpu),
        ("workers", before.workers_cpu, after.workers_cpu),
        ("nats-server", before.nats_cpu, after.nats_cpu),
        ("redis-server", before.redis_cpu, after.redis_cpu),
    ];
    for (part, a, b) in cpu {
        report.add(
            &format!("cost per {unit}: {part} CPU"),
            per(a, b) * 1e6,
            "µs",
        );
    }
    let (a, b) = (&before.redis, &after.redis);
    report.add(
        &format!("cost per {unit}: Redis commands"),
        per(a.commands, b.commands),
        "",
    );
    report.add(
        &format!("cost per {unit}: bytes to Redis"),
        per(a.bytes_in, b.bytes_in),
        "B",
    );
    report.add(
        &format!("cost per {unit}: bytes from Redis"),
        per(a.bytes_out, b.bytes_out),
        "B",
    );
}

/// User and system CPU time of process `pid` (all its threads, living and ended), in seconds.
pub(crate) fn cpu_seconds(pid: u32) -> Result<f64, Failed> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name is in parentheses and may hold spaces: fields count from after it.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| format!("unreadable /proc/{pid}/stat"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line: 11 and 12 counting from 0 after the name.
    let ticks = |i: usize| -> Result<f64, Failed> {
        Ok(fields
            .get(i)
            .ok_or_else(|| format!("short /proc/{pid}/stat"))?
            .parse::<f64>()?)
    };
    Ok((ticks(11)? + ticks(12)?) / TICKS_PER_SECOND)
}

/// Commands processed and bytes in and out, from `INFO stats`.
async fn redis_counters(redis: &mut MultiplexedConnection) -> Result<RedisCounters, Failed> {
    let info: String = redis::cmd("INFO").arg("stats").query_async(redis).await?;
    let mut counters = RedisCounters::default();
    for line in info.lines() {
        let Some((name, value)) = line.trim().split_once(':') else {
            continue;
        };
        let slot = match name {
            "total_commands_processed" => &mut counters.commands,
            "total_net_input_bytes" => &mut counters.bytes_in,
            "total_net_output_bytes" => &mut counters.bytes_out,
            _ => continue,
        };
        *slot = value.parse()?;
    }
    Ok(counters)
}
