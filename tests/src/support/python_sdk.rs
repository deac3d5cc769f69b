//! The official Python client libraries the gateway is checked with, pinned, installed from PyPI
//! into a virtual environment cached under `~/.cache/skein-tests-sdk-<pins>` (made once, in a
//! temporary directory renamed into place, so concurrent tests never see a half-made one), and
//! the scripts of `tests/sdk/` run with it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `openai` library the gateway's OpenAI surface is checked with.
pub const OPENAI: &str = "openai==3.51.0";

/// LangGraph's client library the gateway's Agent Protocol is checked with.
pub const LANGGRAPH: &str = "langgraph-sdk==0.4.14";

/// The A2A library the gateway's A2A surface is checked with (its HTTP client included).
pub const A2A: &str = "a2a-sdk[http-server]==1.3.0";

/// The Python of a virtual environment holding `packages`, made if missing.
pub fn python_with(packages: &[&str]) -> Result<PathBuf, String> {
    let mut name = packages.join("_");
    name.retain(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '='));
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    let home = cache.join(format!("skein-tests-sdk-{}", name.replace("==", "-")));
    let python = home.join("bin/python");
    if python.exists() {
        return Ok(python);
    }
    std::fs::create_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let building = cache.join(format!(".building-{}", super::unique("sdk")));
    let run = |command: &mut Command, what: &str| -> Result<(), String> {
        let output = command
            .output()
            .map_err(|e| format!("{what} could not start: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{what} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    };
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&building),
        "python3 -m venv (Debian: apt-get install python3-venv)",
    )?;
    run(
        Command::new(building.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(packages),
        &format!("pip install {}", packages.join(" ")),
    )?;
    // A virtual environment names its own directory in its scripts: make it again in place.
    match std::fs::rename(&building, &home) {
        Ok(()) => {}
        // Another test made it first.
        Err(_) if python.exists() => {
            let _ = std::fs::remove_dir_all(&building);
            return Ok(python);
        }
        Err(e) => return Err(format!("{}: {e}", home.display())),
    }
    run(
        Command::new("python3")
            .args(["-m", "venv", "--upgrade"])
            .arg(&home),
        "python3 -m venv --upgrade",
    )?;
    Ok(python)
}

/// Runs `tests/sdk/<script>` with `python` and `args`; its standard output read as JSON.
pub fn run_script(python: &Path, script: &str, args: &[&str]) -> Result<serde_json::Value, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("sdk")
        .join(script);
    let output = Command::new(python)
        .arg(&path)
        .args(args)
        .output()
        .map_err(|e| format!("{script} could not start: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{script} failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| {
        format!(
            "{script} printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}
