//! Cutting text to a byte budget on a character boundary: every text that can echo outside
//! input (failure messages, dead-letter reasons, error bodies) is bounded with these.

/// The largest char boundary of `text` at or below `index`.
pub fn floor_char_boundary(text: &str, index: usize) -> usize {
    if index >= text.len() {
        return text.len();
    }
    (0..=index)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0)
}

/// The smallest char boundary of `text` at or above `index`.
pub fn ceil_char_boundary(text: &str, index: usize) -> usize {
    if index >= text.len() {
        return text.len();
    }
    (index..=text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len())
}

/// `text` cut to at most `max_bytes` bytes on a character boundary, ending in `…` when cut.
pub fn cut(text: &str, max_bytes: usize) -> String {
    const MARK: &str = "…";
    if text.len() <= max_bytes {
        return text.to_owned();
    }
    let end = floor_char_boundary(text, max_bytes.saturating_sub(MARK.len()));
    format!("{}{MARK}", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_on_a_char_boundary_within_the_budget() {
        assert_eq!(cut("short", 10), "short");
        let long = "é".repeat(100);
        let cut_text = cut(&long, 51);
        assert!(cut_text.len() <= 51, "{}", cut_text.len());
        assert!(cut_text.ends_with('…'));
        assert_eq!(floor_char_boundary("aé", 2), 1);
        assert_eq!(floor_char_boundary("aé", 9), 3);
        assert_eq!(cut("abc", 0), "…");
        assert_eq!(ceil_char_boundary("aé", 2), 3);
        assert_eq!(ceil_char_boundary("aé", 1), 1);
        assert_eq!(ceil_char_boundary("aé", 9), 3);
    }
}
