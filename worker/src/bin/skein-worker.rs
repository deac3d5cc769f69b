//! `skein-worker`: parse config, run the worker until SIGTERM.

fn main() -> std::process::ExitCode {
    skein_worker::WorkerBuilder::new().main()
}
