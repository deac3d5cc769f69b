//! `custom-worker`: the standard worker's flags and environment, with two tools of its own
//! (`word_count`, `ledger_append`; the ledger file is `LEDGER_FILE`, default `ledger.tsv`).

use skein_example_custom_worker::{Ledger, WordCount};

fn main() -> std::process::ExitCode {
    skein_worker::WorkerBuilder::new()
        .tool(WordCount)
        .tool(Ledger::from_env())
        .main()
}
