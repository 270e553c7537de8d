//! `--check`: verify images against checksum lines, as `sha256sum -c` does.
//!
//! Written as a security tool: when in doubt, a check fails. A line that
//! does not parse is never skipped silently at the end (a summary counts
//! them; `--strict` fails the run); a file that is not a checksum file at all
//! (binary data, an image passed by mistake) is refused at its first
//! offending line, without reading the rest.

use blkcli::lines::{self, Entry, MAX_LINE};
use blkhash::{Algorithm, Checksum};
use std::ffi::OsStr;
use std::io::{self, BufRead, Read, Write};
use std::os::unix::ffi::OsStrExt;

/// How to check.
#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    /// Digest and block size for untagged lines.
    pub algorithm: Algorithm,
    /// Block size for untagged lines.
    pub block_size: usize,
    /// Print only failures.
    pub quiet: bool,
    /// Print nothing; the exit status tells.
    pub status: bool,
    /// Warn about each improperly formatted line.
    pub warn: bool,
    /// Fail if any line is improperly formatted.
    pub strict: bool,
    /// Skip images that do not exist.
    pub ignore_missing: bool,
}

#[derive(Default)]
struct Tally {
    malformed: usize,
    unreadable: usize,
    mismatched: usize,
    /// Mismatches on plain `HEX  NAME` lines, which do not say how they were made.
    untagged_mismatched: usize,
    verified: usize,
}

/// The name as check output shows it (its bytes): escaped, with a leading
/// backslash, when it holds a backslash or a newline.
fn shown(name: &OsStr) -> Vec<u8> {
    let line = lines::format_line_os("", name, None);
    match line.strip_prefix(b"\\") {
        Some(rest) => [b"\\", &rest[2..]].concat(),
        None => name.as_bytes().to_vec(),
    }
}

/// `NAME: WHAT` on a line, the name's bytes as they are (escaped as above).
fn say(out: &mut dyn Write, name: &OsStr, what: &str) -> io::Result<()> {
    out.write_all(&shown(name))?;
    writeln!(out, ": {what}")
}

/// Why a checksum file is refused outright.
fn not_a_checksum_file(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("not a checksum file ({why})"),
    )
}

/// Read the next line, at most [`MAX_LINE`] bytes: `None` at the end.
fn next_line(input: &mut dyn BufRead, buf: &mut Vec<u8>) -> io::Result<Option<()>> {
    buf.clear();
    let n = (&mut *input)
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
    } else if buf.len() > MAX_LINE {
        return Err(not_a_checksum_file("a line longer than 16 KiB"));
    }
    if buf.contains(&0) {
        return Err(not_a_checksum_file("binary data"));
    }
    Ok(Some(()))
}

/// Check every line of the checksum file `list` (named `list_name`),
/// computing each image's checksum with `compute(name, digest, block size)`.
/// Returns true if everything listed verified.
pub fn check_file(
    list_name: &str,
    list: &mut dyn BufRead,
    opts: &CheckOptions,
    compute: &mut dyn FnMut(&OsStr, Algorithm, usize) -> io::Result<Checksum>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> io::Result<bool> {
    let mut tally = Tally::default();
    let mut buf = Vec::new();
    let mut lineno = 0usize;
    let mut any_line = false;
    while next_line(list, &mut buf)?.is_some() {
        lineno += 1;
        // A line that is not a checksum line: counted, and named with --warn.
        let mut malformed = |tally: &mut Tally, why: &str| -> io::Result<()> {
            tally.malformed += 1;
            if opts.warn && !opts.status {
                writeln!(err, "blksum: {list_name}: {lineno}: {why}")?;
            }
            Ok(())
        };
        let entry = lines::parse_line_bytes(&buf);
        let Some(Entry {
            name,
            hex,
            algorithm,
            block_size,
        }) = entry
        else {
            malformed(&mut tally, "improperly formatted blkhash checksum line")?;
            continue;
        };
        let alg = algorithm.unwrap_or(opts.algorithm);
        if hex.len() != 2 * alg.output_len() {
            malformed(&mut tally, &format!("checksum length does not fit {alg}"))?;
            continue;
        }
        any_line = true;
        let bs = block_size.unwrap_or(opts.block_size);
        match compute(&name, alg, bs) {
            Ok(sum) if Checksum::from_hex(alg, &hex).is_ok_and(|want| want == sum) => {
                tally.verified += 1;
                if !opts.quiet && !opts.status {
                    say(out, &name, "OK")?;
                }
            }
            Ok(_) => {
                tally.verified += 1;
                tally.mismatched += 1;
                tally.untagged_mismatched += usize::from(algorithm.is_none());
                if !opts.status {
                    say(out, &name, "FAILED")?;
                }
            }
            Err(e) if opts.ignore_missing && e.kind() == io::ErrorKind::NotFound => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Err(e),
            Err(e) => {
                tally.unreadable += 1;
                let lossy = name.to_string_lossy();
                writeln!(err, "blksum: {lossy}: {}", blkcli::units::reason(&e))?;
                if !opts.status {
                    say(out, &name, "FAILED open or read")?;
                }
            }
        }
        out.flush()?;
    }

    if !any_line {
        writeln!(
            err,
            "blksum: {list_name}: no properly formatted checksum lines found"
        )?;
        return Ok(false);
    }
    if !opts.status {
        if tally.malformed > 0 {
            let what = blkcli::plural(tally.malformed as u64, "line is", "lines are");
            writeln!(err, "blksum: WARNING: {what} improperly formatted")?;
        }
        if tally.unreadable > 0 {
            let what = blkcli::plural(tally.unreadable as u64, "listed file", "listed files");
            writeln!(err, "blksum: WARNING: {what} could not be read")?;
        }
        if tally.mismatched > 0 {
            let what = blkcli::plural(
                tally.mismatched as u64,
                "computed checksum",
                "computed checksums",
            );
            writeln!(err, "blksum: WARNING: {what} did NOT match")?;
        }
        // Every image read and none matched, on lines that do not say how
        // they were made: most likely a list from sha256sum or another tool.
        if tally.mismatched == tally.verified
            && tally.untagged_mismatched == tally.mismatched
            && tally.mismatched > 0
        {
            writeln!(
                err,
                "blksum: {list_name}: no listed image matched: these may be checksums of another \
                 construction (a list made by sha256sum, b3sum or another tool); blksum checks \
                 blkhash checksums, as blksum writes them"
            )?;
        }
    }
    if opts.ignore_missing && tally.verified == 0 && tally.unreadable == 0 {
        writeln!(err, "blksum: {list_name}: no file was verified")?;
        return Ok(false);
    }
    Ok(tally.unreadable == 0 && tally.mismatched == 0 && !(opts.strict && tally.malformed > 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use blkhash::{Hasher, Options};

    /// "Images" are names whose content is the name itself; "missing" does not exist.
    fn compute(name: &OsStr, alg: Algorithm, bs: usize) -> io::Result<Checksum> {
        if name.as_bytes().starts_with(b"missing") {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        let mut h =
            Hasher::with_options(Options::new().algorithm(alg).block_size(bs).threads(1)).unwrap();
        h.update(name.as_bytes());
        Ok(h.finalize())
    }

    fn sum(name: &str, alg: Algorithm, bs: usize) -> String {
        compute(OsStr::new(name), alg, bs).unwrap().to_hex()
    }

    fn run(list: &str, opts: &CheckOptions) -> (bool, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let ok = check_file(
            "sums",
            &mut list.as_bytes(),
            opts,
            &mut compute,
            &mut out,
            &mut err,
        )
        .unwrap();
        (
            ok,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    fn opts() -> CheckOptions {
        CheckOptions {
            block_size: 65536,
            ..Default::default()
        }
    }

    #[test]
    fn ok_failed_and_missing() {
        let good = sum("a.img", Algorithm::Sha256, 65536);
        let list = format!("{good}  a.img\n{good}  b.img\n{good}  missing.img\n");
        let (ok, out, err) = run(&list, &opts());
        assert!(!ok);
        assert_eq!(
            out,
            "a.img: OK\nb.img: FAILED\nmissing.img: FAILED open or read\n"
        );
        assert!(
            err.contains("WARNING: 1 computed checksum did NOT match"),
            "{err}"
        );
        assert!(
            err.contains("WARNING: 1 listed file could not be read"),
            "{err}"
        );

        let quiet = CheckOptions {
            quiet: true,
            ..opts()
        };
        let (_, out, _) = run(&list, &quiet);
        assert_eq!(out, "b.img: FAILED\nmissing.img: FAILED open or read\n");

        let status = CheckOptions {
            status: true,
            ..opts()
        };
        let (ok, out, err) = run(&list, &status);
        assert!(!ok);
        assert_eq!(out, "");
        assert!(!err.contains("WARNING"));

        let ignore = CheckOptions {
            ignore_missing: true,
            ..opts()
        };
        let (ok, out, _) = run(&format!("{good}  a.img\n{good}  missing.img\n"), &ignore);
        assert!(ok);
        assert_eq!(out, "a.img: OK\n");
        let (ok, _, err) = run(&format!("{good}  missing.img\n"), &ignore);
        assert!(!ok);
        assert!(err.contains("no file was verified"));
    }

    #[test]
    fn a_list_where_nothing_matches_is_named_as_another_construction() {
        // What sha256sum writes for these "images" (their content is their name).
        let plain = |n: &str| {
            let mut d = [0u8; 32];
            Algorithm::Sha256.digest_into(n.as_bytes(), &mut d);
            blkhash::to_hex(&d)
        };
        let list: String = ["a.img", "b.img"]
            .iter()
            .map(|n| format!("{}  {n}\n", plain(n)))
            .collect();
        let (ok, out, err) = run(&list, &opts());
        assert!(!ok);
        assert_eq!(out, "a.img: FAILED\nb.img: FAILED\n");
        assert!(
            err.contains(
                "sums: no listed image matched: these may be checksums of another construction"
            ),
            "{err}"
        );
        // One match, or a tagged line (it says how it was made): no such hint.
        let good = sum("a.img", Algorithm::Sha256, 65536);
        let (_, _, err) = run(&format!("{good}  a.img\n{list}"), &opts());
        assert!(!err.contains("another construction"), "{err}");
        let tagged = lines::format_line(&"0".repeat(64), "a.img", Some((Algorithm::Sha256, 65536)));
        let (_, _, err) = run(&format!("{tagged}\n"), &opts());
        assert!(!err.contains("another construction"), "{err}");
    }

    #[test]
    fn tagged_lines_need_no_options() {
        let alg = Algorithm::Blake3;
        let line = lines::format_line(&sum("x", alg, 4096), "x", Some((alg, 4096)));
        let (ok, out, _) = run(&format!("{line}\n"), &opts());
        assert!(ok, "{out}");
        assert_eq!(out, "x: OK\n");
    }

    #[test]
    fn malformed_lines_warn_and_strict() {
        let good = sum("a.img", Algorithm::Sha256, 65536);
        let list = format!("garbage\n{good}  a.img\nabc  short.img\n");
        let (ok, out, err) = run(&list, &opts());
        assert!(ok);
        assert_eq!(out, "a.img: OK\n");
        assert!(
            err.contains("WARNING: 2 lines are improperly formatted"),
            "{err}"
        );
        assert!(!err.contains("sums: 1:"));
        let warn = CheckOptions {
            warn: true,
            ..opts()
        };
        let (_, _, err) = run(&list, &warn);
        assert!(err.contains("sums: 1: improperly formatted"), "{err}");
        assert!(err.contains("sums: 3:"), "{err}");
        let strict = CheckOptions {
            strict: true,
            ..opts()
        };
        assert!(!run(&list, &strict).0);
        let (ok, _, err) = run("nothing here\n", &opts());
        assert!(!ok);
        assert!(err.contains("no properly formatted checksum lines found"));
    }

    #[test]
    fn names_with_newlines() {
        let name = "new\nline";
        let line = lines::format_line(&sum(name, Algorithm::Sha256, 65536), name, None);
        let (ok, out, _) = run(&format!("{line}\n"), &opts());
        assert!(ok);
        assert_eq!(out, "\\new\\nline: OK\n");
    }

    #[test]
    fn binary_files_are_refused_at_once() {
        let mut image = vec![b'Q', b'F', b'I', 0xfb, 0, 0, 0, 3];
        image.resize(1 << 20, 0);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut calls = 0;
        let r = check_file(
            "disk.qcow2",
            &mut image.as_slice(),
            &opts(),
            &mut |_, _, _| {
                calls += 1;
                Err(io::Error::other("never"))
            },
            &mut out,
            &mut err,
        );
        assert!(r.unwrap_err().to_string().contains("not a checksum file"));
        assert_eq!(calls, 0);
        let long = "a".repeat(MAX_LINE + 10);
        let r = check_file(
            "long",
            &mut long.as_bytes(),
            &opts(),
            &mut compute,
            &mut out,
            &mut err,
        );
        assert!(r.unwrap_err().to_string().contains("longer"));
    }
}
