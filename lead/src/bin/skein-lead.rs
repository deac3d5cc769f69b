//! `skein-lead`: parse config, run the lead until SIGTERM.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cfg = skein_lead::Config::parse();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(skein_lead::cli::run_lead(cfg)),
        Err(e) => {
            eprintln!("skein-lead: cannot start the async runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
