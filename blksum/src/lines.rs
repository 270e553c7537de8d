//! Checksum lines: writing them, and reading them back for `--check`.
//!
//! Two forms, both one line per image:
//!
//! ```text
//! HEX  NAME                          what sha256sum writes
//! blkhash/DIGEST[/BLOCK] (NAME) = HEX  --tag: self-describing
//! ```
//!
//! The tag names the digest, and the block size when it is not the default
//! 64k (written as `4k`, `1m`...), so a tagged file is checked with no
//! options. The `blkhash/` prefix keeps these lines apart from
//! `sha256sum --tag` lines, whose checksums are of another construction. A
//! name with a backslash, newline or carriage return is escaped (`\\`, `\n`,
//! `\r`) and the line starts with a backslash, as GNU coreutils does.

use blkhash::{Algorithm, DEFAULT_BLOCK_SIZE};

/// The tag prefix of `--tag` lines.
const TAG: &str = "blkhash/";

/// Longest line accepted: room for a 4 KiB path escaped twice over and the
/// longest digest. Anything longer is not a checksum file.
pub const MAX_LINE: usize = 16 << 10;

/// One parsed checksum line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// Lowercase hex.
    pub hex: String,
    /// From the tag; `None` for an untagged line (use the command line's).
    pub algorithm: Option<Algorithm>,
    pub block_size: Option<usize>,
}

/// Escape a name as coreutils does; true if anything was escaped.
fn escape(name: &str) -> (String, bool) {
    if !name.contains(['\\', '\n', '\r']) {
        return (name.to_string(), false);
    }
    let escaped = name
        .replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('\r', "\\r");
    (escaped, true)
}

fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            '\\' => out.push('\\'),
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            _ => return None,
        }
    }
    Some(out)
}

/// A block size as the tag writes it: `4k`, `1m`, or bytes.
fn size_word(n: usize) -> String {
    if n.is_multiple_of(1 << 20) {
        format!("{}m", n >> 20)
    } else if n.is_multiple_of(1024) {
        format!("{}k", n >> 10)
    } else {
        n.to_string()
    }
}

/// The line for `hex` of `name`: untagged, or tagged with the digest and
/// (when not the default) the block size.
///
/// ```text
/// format_line("ab12", "disk.img", None)                          "ab12  disk.img"
/// format_line("ab12", "disk.img", Some((Blake3, 4096)))          "blkhash/blake3/4k (disk.img) = ab12"
/// ```
pub fn format_line(hex: &str, name: &str, tag: Option<(Algorithm, usize)>) -> String {
    let (name, escaped) = escape(name);
    let lead = if escaped { "\\" } else { "" };
    match tag {
        None => format!("{lead}{hex}  {name}"),
        Some((alg, bs)) if bs == DEFAULT_BLOCK_SIZE => {
            format!("{lead}{TAG}{alg} ({name}) = {hex}")
        }
        Some((alg, bs)) => format!("{lead}{TAG}{alg}/{} ({name}) = {hex}", size_word(bs)),
    }
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Parse one line (without its newline). `None` if it is not a checksum line.
pub fn parse_line(line: &str) -> Option<Entry> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let (escaped, line) = match line.strip_prefix('\\') {
        Some(rest) => (true, rest),
        None => (false, line),
    };
    let name = |s: &str| {
        if s.is_empty() {
            None
        } else if escaped {
            unescape(s)
        } else {
            Some(s.to_string())
        }
    };
    if let Some(rest) = line.strip_prefix(TAG) {
        let (tag, rest) = rest.split_once(" (")?;
        let (file, hex) = rest.rsplit_once(") = ")?;
        let (alg, bs) = match tag.split_once('/') {
            Some((alg, bs)) => (alg, Some(parse_block_size(bs)?)),
            None => (tag, None),
        };
        let algorithm: Algorithm = alg.parse().ok()?;
        if !is_hex(hex) || hex.len() != 2 * algorithm.output_len() {
            return None;
        }
        return Some(Entry {
            name: name(file)?,
            hex: hex.to_ascii_lowercase(),
            algorithm: Some(algorithm),
            block_size: Some(bs.unwrap_or(DEFAULT_BLOCK_SIZE)),
        });
    }
    // HEX, two characters (space and space, or space and '*' for sha256sum's
    // binary mode), NAME.
    let sep = line.find(' ')?;
    let (hex, rest) = line.split_at(sep);
    let file = rest
        .strip_prefix("  ")
        .or_else(|| rest.strip_prefix(" *"))?;
    if !is_hex(hex) {
        return None;
    }
    Some(Entry {
        name: name(file)?,
        hex: hex.to_ascii_lowercase(),
        algorithm: None,
        block_size: None,
    })
}

fn parse_block_size(s: &str) -> Option<usize> {
    let n = crate::cli::parse_size(s).ok()?;
    let n = usize::try_from(n).ok()?;
    blkhash::Options::new().block_size(n).validate().ok()?;
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untagged_round_trip() {
        for name in [
            "disk.img",
            "a b  c",
            "back\\slash",
            "new\nline",
            "cr\rx",
            " lead",
            "*star",
        ] {
            let line = format_line("00ff", name, None);
            assert_eq!(line.lines().count(), 1, "{name:?}");
            let e = parse_line(&line).unwrap();
            assert_eq!(e.name, name);
            assert_eq!(e.hex, "00ff");
            assert_eq!(e.algorithm, None);
        }
        assert_eq!(format_line("ab", "x", None), "ab  x");
        assert_eq!(format_line("ab", "a\\b\nc", None), "\\ab  a\\\\b\\nc");
    }

    #[test]
    fn tagged_round_trip() {
        let hex32 = "ab".repeat(32);
        for (alg, bs) in [
            (Algorithm::Sha256, 65536),
            (Algorithm::Blake3, 4096),
            (Algorithm::Sha512_256, 1 << 20),
            (Algorithm::Sha256, 1536),
        ] {
            for name in ["disk.img", "x (1) = y", "new\nline"] {
                let line = format_line(&hex32, name, Some((alg, bs)));
                let e = parse_line(&line).unwrap_or_else(|| panic!("{line}"));
                assert_eq!(
                    (e.name.as_str(), e.algorithm, e.block_size),
                    (name, Some(alg), Some(bs))
                );
            }
        }
        assert_eq!(
            format_line(&hex32, "d", Some((Algorithm::Blake3, 4096))),
            format!("blkhash/blake3/4k (d) = {hex32}")
        );
        assert_eq!(
            format_line(&hex32, "d", Some((Algorithm::Sha256, 65536))),
            format!("blkhash/sha256 (d) = {hex32}")
        );
    }

    #[test]
    fn sha256sum_forms() {
        let e = parse_line("ABCD *file.iso").unwrap();
        assert_eq!((e.hex.as_str(), e.name.as_str()), ("abcd", "file.iso"));
        assert!(parse_line("abcd  file\r").is_some_and(|e| e.name == "file"));
    }

    #[test]
    fn malformed() {
        let hex32 = "ab".repeat(32);
        for line in [
            "",
            "   ",
            "abcd",
            "abcd ",
            "abcd  ",
            "xyz  file",
            "abcd file",
            "\\abcd  bad\\escape",
            "blkhash/sha256 (x) = abcd",
            &format!("blkhash/sha257 (x) = {hex32}"),
            &format!("blkhash/sha256/1000 (x) = {hex32}"),
            &format!("blkhash/sha256 x = {hex32}"),
            &format!("SHA256 (x) = {hex32}"),
            "\u{0}\u{1}\u{2}",
        ] {
            assert_eq!(parse_line(line), None, "{line:?}");
        }
    }
}
