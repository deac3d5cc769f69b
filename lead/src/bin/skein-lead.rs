//! `skein-lead`: parse config, run the lead until SIGTERM.

use clap::Parser;

skein_common::global_allocator!();

fn main() -> std::process::ExitCode {
    let cfg = skein_lead::Config::parse();
    skein_lead::cli::block_on("skein-lead", skein_lead::cli::run_lead(cfg))
}
