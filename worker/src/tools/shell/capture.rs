//! Output capture of a command: each stream keeps its first and its last `keep` bytes and counts
//! the rest, so a command printing gigabytes costs the worker a fixed amount of memory; the
//! text for the model is cut to a byte budget, keeping the head and the tail and saying how much
//! was cut from the middle.
//!
//! Invariants: a rendered stream is at most its budget plus one cut note; a cut never splits a
//! UTF-8 character (bytes that are not UTF-8 show as replacement characters); what is kept is
//! always a prefix and a suffix of what the command wrote.

use std::collections::VecDeque;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Bytes read from a pipe at a time.
const READ_CHUNK: usize = 8 * 1024;

/// What one stream (stdout or stderr) of a command wrote, head and tail.
#[derive(Debug)]
pub(super) struct Capture {
    keep: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl Capture {
    /// Keeps up to `keep` bytes of the head and `keep` of the tail.
    pub fn new(keep: usize) -> Self {
        Self {
            keep,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    /// Bytes the command wrote to this stream.
    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.keep.saturating_sub(self.head.len());
        let into_head = room.min(bytes.len());
        self.head.extend_from_slice(&bytes[..into_head]);
        bytes = &bytes[into_head..];
        if bytes.len() >= self.keep {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.keep..]);
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.keep);
        self.tail.drain(..overflow);
        self.tail.extend(bytes);
    }

    /// Reads `reader` to its end. Whatever was read stays captured if this is dropped half-way
    /// or fails.
    pub async fn read_from(&mut self, mut reader: impl AsyncRead + Unpin) -> std::io::Result<()> {
        let mut buffer = vec![0u8; READ_CHUNK];
        loop {
            let read = reader.read(&mut buffer).await?;
            if read == 0 {
                return Ok(());
            }
            self.push(&buffer[..read]);
        }
    }

    /// The stream as text of at most `budget` bytes (plus a note of what was cut).
    pub fn render(&self, budget: usize) -> String {
        let mut kept = self.head.clone();
        kept.extend(self.tail.iter());
        let dropped = self.total - kept.len() as u64;
        if dropped == 0 && kept.len() <= budget {
            return String::from_utf8_lossy(&kept).into_owned();
        }
        let head_len = (budget / 2).min(kept.len());
        let tail_len = (budget - head_len).min(kept.len() - head_len);
        let mut head = kept[..head_len].to_vec();
        crate::tools::trim_partial_utf8(&mut head);
        let mut tail = &kept[kept.len() - tail_len..];
        // Skip continuation bytes of a character that started before the cut.
        let continuation = tail
            .iter()
            .take(3)
            .take_while(|b| (**b & 0b1100_0000) == 0b1000_0000)
            .count();
        if continuation < tail.len() {
            tail = &tail[continuation..];
        }
        let cut = self.total - head.len() as u64 - tail.len() as u64;
        format!(
            "{}\n[... {cut} bytes cut from the middle ...]\n{}",
            String::from_utf8_lossy(&head),
            String::from_utf8_lossy(tail)
        )
    }
}

/// Shares `cap` bytes between stdout and stderr: both whole when they fit, else each gets half,
/// and a stream shorter than half leaves the rest to the other.
pub(super) fn split_budget(cap: usize, stdout: u64, stderr: u64) -> (usize, usize) {
    let (out, err) = (clamp(stdout), clamp(stderr));
    if out.saturating_add(err) <= cap {
        return (out, err);
    }
    let half = cap / 2;
    if out <= half {
        (out, cap - out)
    } else if err <= half {
        (cap - err, err)
    } else {
        (cap - half, half)
    }
}

fn clamp(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(keep: usize, chunks: &[&[u8]]) -> Capture {
        let mut capture = Capture::new(keep);
        for chunk in chunks {
            capture.push(chunk);
        }
        capture
    }

    #[test]
    fn short_output_is_whole() {
        let capture = captured(16, &[b"hello ", b"world"]);
        assert_eq!(capture.render(16), "hello world");
        assert_eq!(capture.total(), 11);
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_counts_the_cut() {
        let text: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        // Written in odd-sized chunks, as a pipe would deliver it.
        let chunks: Vec<&[u8]> = text.as_bytes().chunks(37).collect();
        let capture = captured(100, &chunks);
        let rendered = capture.render(100);
        assert!(rendered.starts_with("line 0\nline 1\n"), "{rendered}");
        assert!(rendered.ends_with("line 998\nline 999\n"), "{rendered}");
        let cut = text.len() - 100;
        assert!(
            rendered.contains(&format!("[... {cut} bytes cut from the middle ...]")),
            "{rendered}"
        );
        let (head, tail) = rendered.split_once("\n[... ").expect("note");
        let tail = tail.split_once("...]\n").expect("note end").1;
        assert_eq!(head.len() + tail.len(), 100);
        assert!(text.starts_with(head) && text.ends_with(tail));
    }

    #[test]
    fn a_smaller_budget_than_kept_still_cuts_in_the_middle() {
        let capture = captured(64, &[&[b'a'; 50], &[b'b'; 50]]);
        assert_eq!(
            capture.render(10),
            "aaaaa\n[... 90 bytes cut from the middle ...]\nbbbbb"
        );
        // Everything fits the keep but not the budget: still a cut.
        let small = captured(64, &[b"0123456789"]);
        assert_eq!(
            small.render(4),
            "01\n[... 6 bytes cut from the middle ...]\n89"
        );
    }

    #[test]
    fn cuts_never_split_a_character() {
        let text = "é".repeat(100);
        let capture = captured(9, &[text.as_bytes()]);
        let rendered = capture.render(9);
        assert!(!rendered.contains('\u{fffd}'), "{rendered}");
        let (head, rest) = rendered.split_once('\n').expect("note");
        let tail = rest.rsplit_once('\n').expect("note").1;
        assert!(head.chars().all(|c| c == 'é') && !head.is_empty());
        assert!(tail.chars().all(|c| c == 'é') && !tail.is_empty());
    }

    #[test]
    fn binary_output_is_shown_lossily() {
        let capture = captured(16, &[&[0xff, b'o', b'k']]);
        assert_eq!(capture.render(16), "\u{fffd}ok");
    }

    #[tokio::test]
    async fn reads_a_stream_to_its_end() {
        let mut capture = Capture::new(4);
        capture.read_from(&b"abcdefghij"[..]).await.expect("reads");
        assert_eq!(capture.total(), 10);
        assert_eq!(
            capture.render(8),
            "abcd\n[... 2 bytes cut from the middle ...]\nghij"
        );
    }

    #[test]
    fn the_budget_is_shared_between_the_streams() {
        assert_eq!(split_budget(100, 30, 40), (30, 40));
        assert_eq!(split_budget(100, 10, 500), (10, 90));
        assert_eq!(split_budget(100, 500, 20), (80, 20));
        assert_eq!(split_budget(100, 500, 500), (50, 50));
        assert_eq!(split_budget(101, 500, 500), (51, 50));
    }
}
