//! Cutting text to a byte budget on a character boundary: every text that can echo outside
//! input (failure messages, dead-letter reasons, error bodies) is bounded with these. Also the
//! size of a JSON value, measured without building it, and names joined at their exact length
//! (the Redis keys, subjects and call keys built on every step of a turn, where `format!` would
//! grow each string several times), and bytes written as lowercase hex (the trace ids every
//! published message carries, where `format!` goes through the formatting machinery per byte).

/// `parts` joined into one string, allocated once at its exact length.
pub fn joined(parts: &[&str]) -> String {
    let mut text = String::with_capacity(parts.iter().map(|part| part.len()).sum());
    for part in parts {
        text.push_str(part);
    }
    text
}

/// Appends `bytes` to `text` as lowercase hex, two digits a byte.
pub fn push_hex(text: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    text.reserve(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
}

/// [`joined`] with a number in decimal among the parts, at `at`.
pub fn joined_with_number(parts: &[&str], at: usize, number: u64) -> String {
    let mut digits = itoa::Buffer::new();
    let number = digits.format(number);
    let len = parts.iter().map(|part| part.len()).sum::<usize>() + number.len();
    let mut text = String::with_capacity(len);
    for (i, part) in parts.iter().enumerate() {
        if i == at {
            text.push_str(number);
        }
        text.push_str(part);
    }
    if at >= parts.len() {
        text.push_str(number);
    }
    text
}

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

/// The length of `value` as compact JSON, measured without building it.
pub fn json_len(value: &serde_json::Value) -> usize {
    // A JSON value always serializes.
    crate::json_out::encoded_len(value).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_at_the_exact_length_with_a_number_where_asked() {
        let key = joined(&["skein:{", "acme", ":", "s1", "}:lease"]);
        assert_eq!(key, "skein:{acme:s1}:lease");
        assert_eq!(key.capacity(), key.len());
        assert_eq!(joined(&[]), "");
        for (at, expected) in [(0, "7a:b"), (1, "a7:b"), (3, "a:b7"), (9, "a:b7")] {
            let text = joined_with_number(&["a", ":", "b"], at, 7);
            assert_eq!(text, expected);
            assert_eq!(text.capacity(), text.len());
        }
        assert_eq!(
            joined_with_number(&["t", ":", ":", "c"], 2, u64::MAX),
            format!("t:{}:c", u64::MAX)
        );
        assert_eq!(
            crate::protocol::call_key("t1", 12, "call_3"),
            "t1:12:call_3"
        );
        assert_eq!(
            crate::subjects::reply("lead-1", 42),
            format!("{}lead-1.42", crate::subjects::REPLY_PREFIX)
        );
    }

    #[test]
    fn hex_is_two_lowercase_digits_a_byte_as_formatting_writes_it() {
        let bytes = [0x00, 0x0f, 0xa5, 0xff, 0x10];
        let mut text = String::from("id=");
        push_hex(&mut text, &bytes);
        let formatted: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(text, format!("id={formatted}"));
        assert_eq!(text, "id=000fa5ff10");
    }

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

    #[test]
    fn a_json_length_is_that_of_the_json_text() {
        let value = serde_json::json!({"path": "a \"b\"", "n": [1, 2.5, null], "é": true});
        assert_eq!(super::json_len(&value), value.to_string().len());
    }
}
