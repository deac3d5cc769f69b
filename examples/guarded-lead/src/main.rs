//! `guarded-lead`: the standard lead's flags, plus `SKEIN_BLOCKED_WORD` (default `production`):
//! tool calls whose arguments mention it are refused before they reach a worker.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let mut cfg = skein_lead::Config::parse();
    let word = std::env::var(skein_example_guarded_lead::ENV_BLOCKED_WORD)
        .unwrap_or_else(|_| "production".into());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("guarded-lead: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let instance = cfg.process.instance_id("lead");
        cfg.process.instance_id = Some(instance.clone());
        let validated = cfg.validate();
        let telemetry = cfg.telemetry.clone();
        skein_common::shutdown::serve_until_signal(
            "guarded-lead",
            &instance,
            &telemetry,
            validated,
            |shutdown| async move { skein_example_guarded_lead::run(cfg, &word, shutdown).await },
        )
        .await
    })
}
