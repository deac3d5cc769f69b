//! `skein-worker`: parse config, run the worker until SIGTERM.

/// mimalloc rather than glibc's allocator: a turn makes about 1,300 allocations, glibc's took
/// about 30 % of the lead's CPU, and its per-thread arenas kept what a burst had freed.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    skein_worker::WorkerBuilder::new().main()
}
