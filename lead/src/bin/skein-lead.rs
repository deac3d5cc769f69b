//! `skein-lead`: parse config, run the lead until SIGTERM.

use clap::Parser;

/// mimalloc rather than glibc's allocator: a turn makes about 1,300 allocations, glibc's took
/// about 30 % of the lead's CPU, and its per-thread arenas kept what a burst had freed.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cfg = skein_lead::Config::parse();
    skein_lead::cli::block_on("skein-lead", skein_lead::cli::run_lead(cfg))
}
