//! Rules-file bytes to text: UTF-8 only, and a file that is not is reported at the line and column
//! of its first invalid byte (binary files, Latin-1 editors). Pure.

use super::model::Location;

/// The file's text, or where its first invalid byte is and a message saying so.
pub fn decode(bytes: Vec<u8>) -> Result<String, (Location, String)> {
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        // Everything before `valid` is UTF-8: count lines in bytes, columns in characters.
        let before = std::str::from_utf8(&bytes[..valid]).unwrap_or_default();
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        let message = format!(
            "not valid UTF-8 (byte 0x{:02X}): a rules file must be UTF-8 text",
            bytes[valid]
        );
        (Location { line, column }, message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_text_passes_through() {
        assert_eq!(decode(b"domain: a\n".to_vec()), Ok("domain: a\n".into()));
    }

    #[test]
    fn the_first_invalid_byte_is_located_in_characters() {
        let (at, message) = decode(b"domain: a\n# \xc3\xa9t\xc3\xa9 ok\nkey: caf\xe9\n".to_vec())
            .expect_err("Latin-1 byte");
        assert_eq!(at, Location { line: 3, column: 9 });
        assert!(
            message.contains("0xE9") && message.contains("UTF-8"),
            "{message}"
        );
        let (at, _) = decode(vec![0x00, 0xff, 0xfe]).expect_err("binary");
        assert_eq!(at, Location { line: 1, column: 2 });
    }
}
