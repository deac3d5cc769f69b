//! `skein-worker`: parse config, run the worker until SIGTERM.

use clap::Parser;
use skein_common::shutdown::serve_until_signal;

fn main() -> std::process::ExitCode {
    let mut cfg = skein_worker::Config::parse();
    let instance = cfg.process.instance_id("worker");
    cfg.process.instance_id = Some(instance.clone());
    let validated = cfg.validate();
    let telemetry = cfg.telemetry.clone();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(serve_until_signal(
            "skein-worker",
            &instance,
            &telemetry,
            validated,
            |shutdown| skein_worker::run(cfg, shutdown),
        )),
        Err(e) => {
            eprintln!("skein-worker: cannot start the async runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
