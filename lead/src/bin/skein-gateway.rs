//! `skein-gateway`: parse config, serve the HTTP gateway until SIGTERM (the same as
//! `skein gateway`).

use clap::Parser;

/// mimalloc rather than glibc's allocator: a turn makes about 1,300 allocations, glibc's took
/// about 30 % of the lead's CPU, and its per-thread arenas kept what a burst had freed.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let command = skein_lead::cli::GatewayCommand::parse();
    skein_lead::cli::block_on(
        "skein-gateway",
        skein_lead::cli::run_gateway(command.gateway),
    )
}
