//! `skein-mcp-fixture`: the MCP server of the tests (see `skein_tests::support::mcp_fixture`).

fn main() -> std::process::ExitCode {
    skein_tests::support::mcp_fixture::main_from(std::env::args().skip(1).collect())
}
