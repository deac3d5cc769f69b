//! `skein`: the command-line interface (see `skein --help`).

skein_common::global_allocator!();

fn main() -> std::process::ExitCode {
    skein_lead::cli::main()
}
