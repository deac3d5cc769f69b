//! `skein`: the command-line interface (see `skein --help`).

fn main() -> std::process::ExitCode {
    skein_lead::cli::main()
}
