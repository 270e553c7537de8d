//! Checksum files from untrusted bytes (`blksum --check LIST`): every line
//! goes through the line parser and the check loop, with images whose
//! checksum is derived from their name (some missing, some unreadable).
//! Errors and FAILED lines are fine; a panic, a hang, or a run that reads
//! a line longer than the limit without refusing the file is not.

use blkcli::lines::{MAX_LINE, Tag, format_line_os, parse_line_bytes};
use blkhash::{Algorithm, Checksum, Options, checksum_with};
use blksum::check::{CheckOptions, check_file};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;

/// An "image" named NAME holds NAME's bytes; names starting with "m" are
/// missing, with "e" unreadable.
fn compute(name: &OsStr, (c, alg, bs): Tag) -> io::Result<Checksum> {
    match name.as_bytes().first() {
        Some(b'm') => return Err(io::ErrorKind::NotFound.into()),
        Some(b'e') => return Err(io::Error::other("unreadable")),
        _ => {}
    }
    // The construction without a worker pool: this target is about the
    // check loop and the line parser, not the hasher.
    Options::new()
        .algorithm(alg)
        .block_size(bs)
        .validate()
        .map_err(io::Error::other)?;
    Ok(checksum_with(c, alg, bs, name.as_bytes()))
}

/// The target's check of one input.
pub fn check(data: &[u8]) {
    let Some((&flags, list)) = data.split_first() else {
        return;
    };
    let opts = CheckOptions {
        construction: Default::default(),
        algorithm: Algorithm::Sha256,
        block_size: 4096,
        quiet: flags & 1 != 0,
        status: flags & 2 != 0,
        warn: flags & 4 != 0,
        strict: flags & 8 != 0,
        ignore_missing: flags & 16 != 0,
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let result = check_file(
        "list",
        &mut io::Cursor::new(list),
        &opts,
        &mut compute,
        &mut out,
        &mut err,
    );
    // A file with a line over the limit, or binary data, is refused whole.
    let longest = list
        .split(|&b| b == b'\n')
        .map(<[u8]>::len)
        .max()
        .unwrap_or(0);
    if longest > MAX_LINE || list.contains(&0) {
        assert!(result.is_err());
    }
    // Every line that parses writes back to a line that parses the same.
    for line in list.split(|&b| b == b'\n') {
        let Some(e) = parse_line_bytes(line) else {
            continue;
        };
        let tag = e
            .construction
            .zip(e.algorithm)
            .zip(e.block_size)
            .map(|((c, a), b)| (c, a, b));
        let again =
            parse_line_bytes(&format_line_os(&e.hex, &e.name, tag)).expect("a written line parses");
        assert_eq!(again.name, e.name);
        assert_eq!(again.hex, e.hex);
        if tag.is_some() {
            assert_eq!(again.construction, e.construction);
            assert_eq!(again.algorithm, e.algorithm);
            assert_eq!(again.block_size, e.block_size);
        }
    }
}
