//! The `skein` command built inside the test crate, so tests can start real lead and worker
//! processes (`skein-node lead ...`, `skein-node worker ...`, `skein-node test-worker ...`)
//! through Cargo's test binaries.

/// mimalloc rather than glibc's allocator: a turn makes about 1,300 allocations, glibc's took
/// about 30 % of the lead's CPU, and its per-thread arenas kept what a burst had freed.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    skein_tests::support::node::main_from(std::env::args().collect())
}
