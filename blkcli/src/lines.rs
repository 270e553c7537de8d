//! Checksum lines: writing them, and reading them back for `--check`.
//!
//! Two forms, both one line per image:
//!
//! ```text
//! HEX  NAME                                 what sha256sum writes
//! CONSTRUCTION/DIGEST[/BLOCK] (NAME) = HEX    --tag: self-describing
//! ```
//!
//! The tag names the construction (`blkhash`, `imageio`, `pbs`), the
//! digest, and the block size when it is not the construction's default
//! (64k for blkhash, 4m for the others; written as `4k`, `1m`...), so a
//! tagged file is checked with no options. The construction prefix keeps
//! these lines apart from `sha256sum --tag` lines, whose checksums are of
//! another construction. A
//! name with a backslash, newline or carriage return is escaped (`\\`, `\n`,
//! `\r`) and the line starts with a backslash, as GNU coreutils does.

use blkhash::{Algorithm, CONSTRUCTIONS, Construction};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// What a `--tag` line says of its checksum: the construction, the digest
/// and the block size.
pub type Tag = (Construction, Algorithm, usize);

/// Longest line accepted: room for a 4 KiB path escaped twice over and the
/// longest digest. Anything longer is not a checksum file.
pub const MAX_LINE: usize = 16 << 10;

/// One parsed checksum line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The file name: any bytes but NUL, as `sha256sum` takes them.
    pub name: OsString,
    /// Lowercase hex.
    pub hex: String,
    /// From the tag; `None` for an untagged line (use the command line's).
    pub construction: Option<Construction>,
    /// From the tag; `None` for an untagged line (use the command line's).
    pub algorithm: Option<Algorithm>,
    /// From the tag; `None` for an untagged line.
    pub block_size: Option<usize>,
}

/// Escape a name as coreutils does; true if anything was escaped.
fn escape(name: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::with_capacity(name.len());
    let mut escaped = false;
    for &b in name {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            _ => {
                out.push(b);
                continue;
            }
        }
        escaped = true;
    }
    (out, escaped)
}

/// A name of any bytes as a listing prints it (`blkmap bitmaps`): as a
/// checksum line escapes it (`\\`, `\n`, `\r`), and any other control
/// byte (a NUL say) or byte that is not UTF-8 as `\xNN`, so that no name
/// prints raw control bytes or forges a line.
///
/// ```
/// use blkcli::lines::escape_name;
/// assert_eq!(escape_name(b"nightly"), "nightly");
/// assert_eq!(escape_name(b"a\0b\nc\xff"), "a\\x00b\\nc\\xff");
/// ```
pub fn escape_name(name: &[u8]) -> String {
    let mut out = String::with_capacity(name.len());
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                c if c.is_control() && (c as u32) < 0x80 => {
                    out.push_str(&format!("\\x{:02x}", c as u32))
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// For the `--json` documents: a name that is not UTF-8, which their
/// `name` (or `image`) key can only show with U+FFFD in place of the bytes
/// that are not, in full, escaped as [`escape_name`] does (`\\`, `\n`,
/// `\r`, and `\xNN` for an ASCII control byte or a byte that is not
/// UTF-8, as `ls --quoting-style=escape` escapes, in hexadecimal: every
/// byte recoverable); `None` for a UTF-8 name, whose document keeps the
/// keys it always had.
///
/// ```
/// use std::ffi::OsStr;
/// use std::os::unix::ffi::OsStrExt;
/// use blkcli::lines::json_escaped;
/// assert_eq!(json_escaped(OsStr::new("disk.qcow2")), None);
/// assert_eq!(
///     json_escaped(OsStr::from_bytes(b"d\xe9j\xe0 vu\\.img")).as_deref(),
///     Some("d\\xe9j\\xe0 vu\\\\.img")
/// );
/// ```
pub fn json_escaped(name: &std::ffi::OsStr) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    match name.to_str() {
        Some(_) => None,
        None => Some(escape_name(name.as_bytes())),
    }
}

fn unescape(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.iter();
    while let Some(&b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match bytes.next()? {
            b'\\' => out.push(b'\\'),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            _ => return None,
        }
    }
    Some(out)
}

/// A block size as the tag writes it and `--block-size` takes it: `4k`,
/// `1m`, or bytes.
///
/// ```
/// assert_eq!(blkcli::lines::size_word(1 << 20), "1m");
/// assert_eq!(blkcli::lines::size_word(1536), "1536");
/// ```
pub fn size_word(n: usize) -> String {
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
/// format_line("ab12", "disk.img", Some((Blkhash, Blake3, 4096)))  "blkhash/blake3/4k (disk.img) = ab12"
/// format_line("ab12", "disk.img", Some((Pbs, Sha256, 4 << 20)))   "pbs/sha256 (disk.img) = ab12"
/// ```
pub fn format_line(hex: &str, name: &str, tag: Option<Tag>) -> String {
    String::from_utf8(format_line_os(hex, OsStr::new(name), tag))
        .expect("a UTF-8 name makes a UTF-8 line")
}

/// [`format_line`] for a name of any bytes (not UTF-8, as file names may
/// be): the line's bytes.
pub fn format_line_os(hex: &str, name: &OsStr, tag: Option<Tag>) -> Vec<u8> {
    let (name, escaped) = escape(name.as_bytes());
    let mut line = Vec::with_capacity(name.len() + hex.len() + 32);
    if escaped {
        line.push(b'\\');
    }
    push_line(&mut line, hex, &name, tag);
    line
}

/// A line for `--zero` output, as `sha256sum --zero` writes it: the name as
/// it is, never escaped (the caller ends the line with a NUL, which no file
/// name holds).
pub fn format_line_zero(hex: &str, name: &OsStr, tag: Option<Tag>) -> Vec<u8> {
    let mut line = Vec::with_capacity(name.len() + hex.len() + 32);
    push_line(&mut line, hex, name.as_bytes(), tag);
    line
}

fn push_line(line: &mut Vec<u8>, hex: &str, name: &[u8], tag: Option<Tag>) {
    match tag {
        None => {
            line.extend_from_slice(hex.as_bytes());
            line.extend_from_slice(b"  ");
            line.extend_from_slice(name);
        }
        Some((c, alg, bs)) => {
            let tag = match bs == c.default_block_size() {
                true => format!("{c}/{alg} ("),
                false => format!("{c}/{alg}/{} (", size_word(bs)),
            };
            line.extend_from_slice(tag.as_bytes());
            line.extend_from_slice(name);
            line.extend_from_slice(b") = ");
            line.extend_from_slice(hex.as_bytes());
        }
    }
}

fn is_hex(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(u8::is_ascii_hexdigit)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn rfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

/// Parse one line (without its newline). `None` if it is not a checksum line.
pub fn parse_line(line: &str) -> Option<Entry> {
    parse_line_bytes(line.as_bytes())
}

/// [`parse_line`] for a line of any bytes (a name need not be UTF-8).
pub fn parse_line_bytes(line: &[u8]) -> Option<Entry> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let (escaped, line) = match line.strip_prefix(b"\\") {
        Some(rest) => (true, rest),
        None => (false, line),
    };
    let name = |s: &[u8]| {
        let bytes = match (s.is_empty(), escaped) {
            (true, _) => return None,
            (false, true) => unescape(s)?,
            (false, false) => s.to_vec(),
        };
        Some(OsString::from_vec(bytes))
    };
    let hex_of = |h: &[u8]| String::from_utf8(h.to_ascii_lowercase()).ok();
    let tagged = CONSTRUCTIONS.iter().find_map(|c| {
        let rest = line.strip_prefix(c.name().as_bytes())?.strip_prefix(b"/")?;
        Some((*c, rest))
    });
    if let Some((construction, rest)) = tagged {
        let open = find(rest, b" (")?;
        let (tag, rest) = (&rest[..open], &rest[open + 2..]);
        let close = rfind(rest, b") = ")?;
        let (file, hex) = (&rest[..close], &rest[close + 4..]);
        let tag = std::str::from_utf8(tag).ok()?;
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
            hex: hex_of(hex)?,
            construction: Some(construction),
            algorithm: Some(algorithm),
            block_size: Some(bs.unwrap_or(construction.default_block_size())),
        });
    }
    // HEX, two characters (space and space, or space and '*' for sha256sum's
    // binary mode), NAME.
    let sep = line.iter().position(|&b| b == b' ')?;
    let (hex, rest) = line.split_at(sep);
    let file = rest
        .strip_prefix(b"  ")
        .or_else(|| rest.strip_prefix(b" *"))?;
    if !is_hex(hex) {
        return None;
    }
    Some(Entry {
        name: name(file)?,
        hex: hex_of(hex)?,
        construction: None,
        algorithm: None,
        block_size: None,
    })
}

fn parse_block_size(s: &str) -> Option<usize> {
    let n = crate::units::parse_size(s).ok()?;
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
        use Construction::*;
        for (c, alg, bs) in [
            (Blkhash, Algorithm::Sha256, 65536),
            (Blkhash, Algorithm::Blake3, 4096),
            (Blkhash, Algorithm::Sha512_256, 1 << 20),
            (Blkhash, Algorithm::Sha256, 1536),
            (Imageio, Algorithm::Blake2b256, 4 << 20),
            (Imageio, Algorithm::Sha256, 65536),
            (Pbs, Algorithm::Sha256, 4 << 20),
        ] {
            for name in ["disk.img", "x (1) = y", "new\nline"] {
                let line = format_line(&hex32, name, Some((c, alg, bs)));
                let e = parse_line(&line).unwrap_or_else(|| panic!("{line}"));
                assert_eq!(
                    (
                        e.name.to_str().unwrap(),
                        e.construction,
                        e.algorithm,
                        e.block_size
                    ),
                    (name, Some(c), Some(alg), Some(bs))
                );
            }
        }
        assert_eq!(
            format_line(&hex32, "d", Some((Blkhash, Algorithm::Blake3, 4096))),
            format!("blkhash/blake3/4k (d) = {hex32}")
        );
        assert_eq!(
            format_line(&hex32, "d", Some((Blkhash, Algorithm::Sha256, 65536))),
            format!("blkhash/sha256 (d) = {hex32}")
        );
        assert_eq!(
            format_line(&hex32, "d", Some((Imageio, Algorithm::Blake2b256, 4 << 20))),
            format!("imageio/blake2b-256 (d) = {hex32}")
        );
        assert_eq!(
            format_line(&hex32, "d", Some((Pbs, Algorithm::Sha256, 1 << 20))),
            format!("pbs/sha256/1m (d) = {hex32}")
        );
        // imageio's own digest names are taken in a tag too.
        let e = parse_line(&format!("imageio/blake2b (d) = {hex32}")).unwrap();
        assert_eq!(e.algorithm, Some(Algorithm::Blake2b256));
    }

    #[test]
    fn names_that_are_not_utf8() {
        let name = OsStr::from_bytes(b"disk\xff\xfe\n.img");
        for tag in [None, Some((Construction::Blkhash, Algorithm::Blake3, 4096))] {
            let line = format_line_os(&"ab".repeat(32), name, tag);
            assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 0);
            let e = parse_line_bytes(&line).unwrap();
            assert_eq!(e.name, name);
        }
    }

    #[test]
    fn sha256sum_forms() {
        let e = parse_line("ABCD *file.iso").unwrap();
        assert_eq!(
            (e.hex.as_str(), e.name.to_str().unwrap()),
            ("abcd", "file.iso")
        );
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
            &format!("ovirt/sha256 (x) = {hex32}"),
            &format!("imageio (x) = {hex32}"),
            "\u{0}\u{1}\u{2}",
        ] {
            assert_eq!(parse_line(line), None, "{line:?}");
        }
    }
}
