//! JSON strings written eight bytes at a time: [`push_str`] writes a string as `serde_json` does,
//! byte for byte, but checks a word of eight bytes at once for a character that needs escaping
//! and copies clean runs whole (serde_json looks at each byte in turn: about a nanosecond a byte,
//! most of the cost of writing a checkpoint of long messages).
//!
//! Escaped as serde_json escapes them: `"` and `\`, the short forms `\b \t \n \f \r`, any other
//! byte below 0x20 as `\u00xx` (lower-case hex); everything else, DEL and non-ASCII included, is
//! copied as it is.

/// Eight copies of `byte`.
const fn repeated(byte: u8) -> u64 {
    u64::from_ne_bytes([byte; 8])
}

const LOW_BITS: u64 = repeated(0x01);
const HIGH_BITS: u64 = repeated(0x80);

/// Whether any byte of `word` is zero. (Exact for "any": a borrow can only mark a byte above a
/// byte that is zero.)
const fn has_zero_byte(word: u64) -> bool {
    word.wrapping_sub(LOW_BITS) & !word & HIGH_BITS != 0
}

/// Whether any byte of `word` must be escaped: below 0x20, a quote or a backslash.
const fn needs_escape(word: u64) -> bool {
    // A byte below 0x20 is the only one whose value minus 0x20 borrows while its top bit is clear.
    let below_space = word.wrapping_sub(repeated(0x20)) & !word & HIGH_BITS != 0;
    below_space || has_zero_byte(word ^ repeated(b'"')) || has_zero_byte(word ^ repeated(b'\\'))
}

/// Writes the escape sequence of `byte`, one that needs escaping (see [`needs_escape`]).
fn push_escape(out: &mut Vec<u8>, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let short = match byte {
        b'"' => b'"',
        b'\\' => b'\\',
        0x08 => b'b',
        0x09 => b't',
        0x0a => b'n',
        0x0c => b'f',
        0x0d => b'r',
        _ => {
            let hex = [HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 0xf)]];
            out.extend_from_slice(b"\\u00");
            out.extend_from_slice(&hex);
            return;
        }
    };
    out.extend_from_slice(&[b'\\', short]);
}

/// Appends `text` to `out` as a JSON string, quotes included.
pub fn push_str(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // `bytes[written..at]` is clean and not yet copied.
    let (mut written, mut at) = (0, 0);
    while at < bytes.len() {
        if let Some(word) = bytes.get(at..at + 8) {
            let word = u64::from_ne_bytes(word.try_into().expect("eight bytes"));
            if !needs_escape(word) {
                at += 8;
                continue;
            }
        }
        let byte = bytes[at];
        if byte < 0x20 || byte == b'"' || byte == b'\\' {
            out.extend_from_slice(&bytes[written..at]);
            push_escape(out, byte);
            written = at + 1;
        }
        at += 1;
    }
    out.extend_from_slice(&bytes[written..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(text: &str) -> Vec<u8> {
        let mut out = b"[".to_vec();
        push_str(&mut out, text);
        out
    }

    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        let mut texts: Vec<String> = vec![
            String::new(),
            "plain".into(),
            "quote \" and backslash \\ and slash /".into(),
            "tab\tnewline\nreturn\rfeed\x0cback\x08".into(),
            "del \x7f, é, 漢字, 🦀 and \u{2028}".into(),
        ];
        // Every byte below 0x80 alone, and at every place of a word and across two.
        for byte in 0u8..0x80 {
            let c = char::from(byte);
            for before in 0..17 {
                texts.push(format!(
                    "{}{c}{}",
                    "a".repeat(before),
                    "b".repeat(17 - before)
                ));
            }
        }
        // Long runs with escapes far apart, and escapes side by side.
        texts.push(format!("{}\"{}\n", "x".repeat(180), "é".repeat(90)));
        texts.push("\"\"\\\\\n\n\u{1}\u{1f}".repeat(9));
        for text in &texts {
            let mut expected = b"[".to_vec();
            serde_json::to_writer(&mut expected, text).expect("serialized");
            assert_eq!(written(text), expected, "{text:?}");
        }
    }

    #[test]
    fn the_word_check_finds_exactly_the_bytes_that_need_escaping() {
        for byte in 0u8..=255 {
            for place in 0..8 {
                let mut word = [b'a'; 8];
                word[place] = byte;
                let needs = byte < 0x20 || byte == b'"' || byte == b'\\';
                assert_eq!(
                    needs_escape(u64::from_ne_bytes(word)),
                    needs,
                    "{byte:#x} at {place}"
                );
            }
        }
    }
}
