//! `skein-gateway`: parse config, serve the HTTP gateway until SIGTERM (the same as
//! `skein gateway`).

use clap::Parser;

skein_common::global_allocator!();

fn main() -> std::process::ExitCode {
    let command = skein_lead::cli::GatewayCommand::parse();
    skein_lead::cli::block_on(
        "skein-gateway",
        skein_lead::cli::run_gateway(command.gateway),
    )
}
