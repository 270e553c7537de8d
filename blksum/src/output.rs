//! Output lines, as sha256sum writes them.

/// `HEX  NAME`; a name with a backslash or newline is escaped and the line
/// starts with a backslash, as GNU coreutils does, so every line parses back.
///
/// ```text
/// a1b2...  disk.img
/// \a1b2...  new\nline.img
/// ```
pub fn checksum_line(hex: &str, name: &str) -> String {
    if name.contains(['\\', '\n', '\r']) {
        let escaped = name
            .replace('\\', "\\\\")
            .replace('\n', "\\n")
            .replace('\r', "\\r");
        format!("\\{hex}  {escaped}")
    } else {
        format!("{hex}  {name}")
    }
}

/// An I/O error's reason without Rust's " (os error N)" suffix.
pub fn reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.rsplit_once(" (os error ") {
        Some((msg, _)) => msg.to_string(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_coreutils() {
        assert_eq!(checksum_line("ab", "x.img"), "ab  x.img");
        assert_eq!(checksum_line("ab", "a\\b\nc"), "\\ab  a\\\\b\\nc");
        assert_eq!(checksum_line("", "x"), "  x");
    }

    #[test]
    fn reasons() {
        let e = std::io::Error::from_raw_os_error(2);
        assert_eq!(reason(&e), "No such file or directory");
        assert_eq!(reason(&std::io::Error::other("bad")), "bad");
    }
}
