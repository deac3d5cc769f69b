//! The docs say what the code does: every environment variable the binaries read is documented in
//! the README, and the README's two set-up commands exist and are what CI runs.

use std::path::Path;

fn repo_file(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// Every `.rs` file under `dir` (relative to the repository root), recursively.
fn rust_files(dir: &str) -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    let mut pending = vec![root.join(dir)];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    found
}

#[test]
fn every_environment_variable_is_documented() {
    let readme = repo_file("README.md");
    let sources: Vec<String> = ["common/src", "lead/src", "worker/src"]
        .iter()
        .flat_map(|dir| rust_files(dir))
        .map(|path| std::fs::read_to_string(&path).expect("source readable"))
        .collect();
    let names: Vec<&str> = sources
        .iter()
        .flat_map(|source| source.lines())
        .filter(|l| l.trim_start().starts_with("pub const ENV_"))
        .filter_map(|l| l.split('"').nth(1))
        .collect();
    assert!(names.len() > 30, "found the constants: {names:?}");
    for name in names {
        assert!(
            readme.contains(&format!("`{name}`")),
            "{name} is not documented in README.md"
        );
    }
}

#[test]
fn the_readme_commands_exist_and_ci_runs_the_test_command() {
    let readme = repo_file("README.md");
    assert!(
        readme.contains("scripts/dev "),
        "README names the main command"
    );
    assert!(
        readme.contains("scripts/test "),
        "README names the test command"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for script in ["scripts/dev", "scripts/test", "scripts/ensure-services"] {
        assert!(root.join(script).is_file(), "{script} exists");
    }
    let ci = repo_file(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == "scripts/test"),
        "CI runs the README's test command"
    );
}
