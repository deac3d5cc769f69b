//! The `skein` command built inside the test crate, so tests can start real lead and worker
//! processes (`skein-node lead ...`, `skein-node worker ...`, `skein-node test-worker ...`)
//! through Cargo's test binaries.

skein_common::global_allocator!();

fn main() -> std::process::ExitCode {
    skein_tests::support::node::main_from(std::env::args().collect())
}
