//! The `skein` command built inside the test crate, so tests can start real lead and worker
//! processes (`skein-node lead ...`, `skein-node worker ...`) through Cargo's test binaries.
//! `skein-node test-worker ...` is a worker that also provides the test tools (see
//! `support::test_tools`), writing effects to the file named by `SKEIN_TEST_EFFECTS`.

use std::process::ExitCode;

use clap::Parser;
use skein_tests::support::test_tools;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) != Some("test-worker") {
        return skein_lead::cli::main();
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
            eprintln!("skein-node: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(skein_lead::cli::run_worker_with(cfg, |registry| {
        test_tools::register(registry, effects)
    }))
}
