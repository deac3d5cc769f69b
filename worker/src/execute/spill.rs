//! Tool output too large for the model: kept whole in the session's workspace, and the model gets
//! its head and tail with where the rest is, so it can read on with the file tools. Nothing a tool
//! returns is lost to the output cap, and no result can outgrow a broker message.
//!
//! Invariants:
//! - output within the cap is returned unchanged and nothing is written;
//! - the file is named after the tool and the call's idempotency key, so a run of the call again
//!   writes the same file;
//! - output over the workspace's per-file cap is kept up to that cap (the preview says so);
//! - when the workspace cannot take it, the output is cut as before, with a note of its size:
//!   a result is never held back for want of a place to keep it.

use bytes::Bytes;
use skein_common::protocol::TaskOrigin;
use skein_common::text::{ceil_char_boundary, floor_char_boundary};
use skein_common::workspace::WorkspacePath;

use crate::tools::truncate_output;
use crate::workspace::WorkspaceStore;

/// Folder of the session's workspace that holds whole outputs.
pub const RESULTS_DIR: &str = ".skein/results";

/// Room kept in a preview for the note between head and tail.
const NOTE_ROOM: usize = 400;

/// `output` fitted to `cap` bytes for the model (see the module docs).
pub(super) async fn fit_output(
    store: &dyn WorkspaceStore,
    origin: &TaskOrigin,
    tool: &str,
    idempotency_key: &str,
    output: String,
    cap: usize,
) -> String {
    if output.len() <= cap {
        return output;
    }
    let name: String = tool
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    let relative = format!("{RESULTS_DIR}/{name}-{idempotency_key}.txt");
    let Ok(path) = WorkspacePath::parse(&relative) else {
        return truncate_output(output, cap);
    };
    let total = output.len();
    let max_file = usize::try_from(store.limits().max_file_bytes).unwrap_or(usize::MAX);
    let kept = floor_char_boundary(&output, max_file);
    let content = Bytes::copy_from_slice(&output.as_bytes()[..kept]);
    match store.write(origin, &path, content, None).await {
        Ok(()) => preview(&output, cap, &relative, kept),
        Err(e) => {
            tracing::warn!(error = %e.describe(), total, "large tool output not kept in the workspace; cutting it");
            truncate_output(output, cap)
        }
    }
}

/// Head and tail of `output` within `cap` bytes, with a note saying where the whole is.
fn preview(output: &str, cap: usize, path: &str, kept: usize) -> String {
    let total = output.len();
    let room = cap.saturating_sub(NOTE_ROOM);
    let head_end = floor_char_boundary(output, room * 3 / 4);
    let tail_start = ceil_char_boundary(output, total - room / 4).max(head_end);
    let omitted = tail_start - head_end;
    let whole = if kept == total {
        format!("the whole output ({total} bytes)")
    } else {
        format!("its first {kept} of {total} bytes (the workspace's file cap)")
    };
    format!(
        "{}\n[... {omitted} bytes omitted; {whole} is in the workspace at {path}: read it with \
         read_file (offset, max_bytes) or search it with grep_files ...]\n{}",
        &output[..head_end],
        &output[tail_start..]
    )
}

#[cfg(test)]
mod tests {
    use super::preview;

    #[test]
    fn a_preview_keeps_head_and_tail_within_the_cap_on_char_boundaries() {
        let output = format!("HEAD{}TAIL", "é".repeat(10_000));
        let shown = preview(&output, 2_000, ".skein/results/t-1.txt", output.len());
        assert!(shown.len() <= 2_000, "{}", shown.len());
        assert!(
            shown.starts_with("HEAD") && shown.ends_with("TAIL"),
            "{shown}"
        );
        assert!(shown.contains(".skein/results/t-1.txt"));
        assert!(shown.contains(&format!("the whole output ({} bytes)", output.len())));
        let cut = preview(&output, 2_000, "p", 100);
        assert!(cut.contains(&format!("its first 100 of {} bytes", output.len())));
    }
}
