//! The `skein` command built inside the test crate, so tests can start real lead and worker
//! processes (`skein-node lead ...`, `skein-node worker ...`) through Cargo's test binaries.

fn main() -> std::process::ExitCode {
    skein_lead::cli::main()
}
