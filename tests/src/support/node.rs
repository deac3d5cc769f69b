//! The `skein` command for tests and benchmarks, with one extra role: `test-worker`, a worker that
//! also provides the test tools (see [`test_tools`](super::test_tools)), writing effects to the
//! file named by `SKEIN_TEST_EFFECTS`.

use std::process::ExitCode;

use clap::Parser;

use super::test_tools;

/// Runs `args` (the program name first) as the `skein` command.
pub fn main_from(mut args: Vec<String>) -> ExitCode {
    if args.get(1).map(String::as_str) != Some("test-worker") {
        return skein_lead::cli::main_from(args);
    }
    args.remove(1);
    let cfg = skein_worker::Config::parse_from(args);
    let effects = std::env::var_os(test_tools::EFFECTS_FILE_ENV)
        .map(Into::into)
        .unwrap_or_else(|| std::env::temp_dir().join("skein-test-effects.log"));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("skein: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(skein_lead::cli::run_worker_with(cfg, |registry| {
        test_tools::register(registry, effects)
    }))
}
