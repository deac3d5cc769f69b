//! `skein-worker`: parse config, run the worker until SIGTERM.

skein_common::global_allocator!();

fn main() -> std::process::ExitCode {
    skein_worker::WorkerBuilder::new().main()
}
