//! `--check`: verify images against checksum lines, as `sha256sum -c` does.
//!
//! Written as a security tool: when in doubt, a check fails. A line that
//! does not parse is never skipped silently at the end (a summary counts
//! them; `--strict` fails the run); a file that is not a checksum file at all
//! (binary data, an image passed by mistake) is refused at its first
//! offending line, without reading the rest.

use blkcli::lines::{self, Entry, MAX_LINE, Tag};
use blkhash::{ALGORITHMS, Algorithm, Checksum, Construction, DEFAULT_BLOCK_SIZE};
use std::ffi::OsStr;
use std::io::{self, BufRead, Read, Write};
use std::os::unix::ffi::OsStrExt;

/// How to check.
#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    /// Construction for untagged lines.
    pub construction: Construction,
    /// Digest for untagged lines.
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
    /// A line was a checksum line (whatever came of it).
    any_line: bool,
    malformed: usize,
    unreadable: usize,
    mismatched: usize,
    verified: usize,
    /// Plain `HEX  NAME` lines, which do not say how they were made: those
    /// whose image was hashed, and of them those that did not match.
    untagged_verified: usize,
    untagged_mismatched: usize,
    /// Plain lines whose length does not fit the digest they are checked with.
    unfit: usize,
    /// The hex length of the first plain line that did not match or fit.
    failed_len: Option<usize>,
    /// The digests and block sizes the tagged lines name: how the file was made.
    tags: Vec<(Algorithm, usize)>,
    /// The tag of the first line in the BSD form of other tools
    /// (`SHA256 (NAME) = HEX`, as `sha256sum --tag` writes it).
    foreign_tag: Option<String>,
}

/// The tag of a line in the BSD form other tools write, `TAG (NAME) = HEX`
/// (`sha256sum --tag`, `cksum`), which blksum does not read.
fn foreign_tag(line: &[u8]) -> Option<String> {
    let line = std::str::from_utf8(line).ok()?;
    let (tag, rest) = line.split_once(" (")?;
    let (_, hex) = rest.rsplit_once(") = ")?;
    let word = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    let is_hex = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit());
    (!tag.is_empty() && tag.chars().all(word) && is_hex(hex)).then(|| tag.to_string())
}

/// The digests whose checksums are `len` hex digits, by name.
fn digests_of_len(len: usize) -> Vec<Algorithm> {
    ALGORITHMS
        .iter()
        .copied()
        .filter(|a| a.output_len() > 0 && 2 * a.output_len() == len)
        .collect()
}

/// Names as English lists them: "a", "a and b", "a, b and c".
fn and_list(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// The command that checks `list` with `alg` and `block_size`.
fn check_command(list: &str, alg: Algorithm, block_size: usize) -> String {
    match block_size == DEFAULT_BLOCK_SIZE {
        true => format!("blksum -c -d {alg} {list}"),
        false => format!(
            "blksum -c -d {alg} --block-size {} {list}",
            lines::size_word(block_size)
        ),
    }
}

/// What would check plain lines of `len` hex digits that did not verify
/// with `used` (digest, block size): the options of the file's tagged
/// lines when one names a digest of that length (then they are known),
/// else the digests of that length, with an example.
fn options_hint(
    list: &str,
    len: usize,
    used: (Algorithm, usize),
    tags: &[(Algorithm, usize)],
) -> String {
    let of_len = |a: Algorithm| 2 * a.output_len() == len;
    if let Some(&(alg, bs)) = tags.iter().find(|&&(a, b)| of_len(a) && (a, b) != used) {
        return format!(
            "its tagged lines were made with -d {alg} and blocks of {}: `{}` checks the \
             untagged ones if they were made so too",
            lines::size_word(bs),
            check_command(list, alg, bs)
        );
    }
    let fits = digests_of_len(len);
    if fits.is_empty() {
        return format!(
            "the checksums are {len} hex digits, which no blkhash digest writes: a list \
             made by another tool?"
        );
    }
    let names: Vec<&str> = fits.iter().map(|a| a.name()).collect();
    let example = if fits.contains(&Algorithm::Blake3) && used.0 != Algorithm::Blake3 {
        Algorithm::Blake3
    } else {
        fits.iter()
            .copied()
            .find(|&a| a != used.0)
            .unwrap_or(used.0)
    };
    let made = if fits.contains(&used.0) {
        // The digest fits: the block size may be what differs.
        let example_bs = if used.1 == 1 << 20 { 4096 } else { 1 << 20 };
        format!(
            "made with another --digest or --block-size? (`{}` checks them if they were made so)",
            check_command(list, example, example_bs)
        )
    } else {
        format!(
            "not {}: made with another --digest? (`{}` checks them if they were made so, with \
             --block-size too if their blocks were not of {})",
            used.0,
            check_command(list, example, used.1),
            lines::size_word(used.1)
        )
    };
    format!(
        "the checksums are {len} hex digits, as {} write{} them, {made} Or checksums of \
         another construction (a list made by sha256sum, b3sum or another tool): blksum checks \
         blkhash checksums, as blksum writes them",
        and_list(&names),
        if names.len() == 1 { "s" } else { "" },
    )
}

/// Why lines in the BSD form of other tools (tag `tag`) do not check.
fn foreign_hint(tag: &str) -> String {
    let ours = match tag.to_ascii_lowercase().parse::<Algorithm>() {
        Ok(a) => format!("blkhash/{a}"),
        Err(_) => "blkhash/DIGEST".to_string(),
    };
    format!(
        "lines such as '{tag} (NAME) = HEX' are the BSD-style lines of sha256sum --tag or \
         cksum, checksums of another construction (check them with sha256sum -c or cksum -c); \
         blksum --tag writes '{ours} (NAME) = HEX', checked with no options"
    )
}

/// The name as check output shows it (its bytes): escaped, with a leading
/// backslash, when it holds a backslash or a newline.
fn shown(name: &OsStr) -> Vec<u8> {
    let name = &*blkcli::shown(name);
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
/// computing each image's checksum with `compute(name, (construction,
/// digest, block size))`. Returns true if everything listed verified.
pub fn check_file(
    list_name: &str,
    list: &mut dyn BufRead,
    opts: &CheckOptions,
    compute: &mut dyn FnMut(&OsStr, Tag) -> io::Result<Checksum>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> io::Result<bool> {
    let mut tally = Tally::default();
    let mut buf = Vec::new();
    let mut lineno = 0usize;
    while next_line(list, &mut buf)?.is_some() {
        lineno += 1;
        let line = Line {
            list_name,
            lineno,
            opts,
        };
        line.check(&buf, &mut tally, compute, out, err)?;
    }
    summarize(list_name, opts, tally, err)
}

/// One line of a checksum file, where messages place it.
struct Line<'a> {
    list_name: &'a str,
    lineno: usize,
    opts: &'a CheckOptions,
}

impl Line<'_> {
    /// A line that is not a checksum line: counted, and named with --warn.
    fn malformed(&self, tally: &mut Tally, err: &mut dyn Write, why: &str) -> io::Result<()> {
        tally.malformed += 1;
        if self.opts.warn && !self.opts.status {
            writeln!(err, "blksum: {}: {}: {why}", self.list_name, self.lineno)?;
        }
        Ok(())
    }

    /// A plain line whose checksum has not the length of `alg`'s.
    fn unfit(
        &self,
        len: usize,
        alg: Algorithm,
        tally: &mut Tally,
        err: &mut dyn Write,
    ) -> io::Result<()> {
        tally.unfit += 1;
        tally.failed_len.get_or_insert(len);
        let fits: Vec<&str> = digests_of_len(len).iter().map(|a| a.name()).collect();
        let why = match fits.is_empty() {
            true => format!("checksum length does not fit {alg}"),
            false => format!(
                "checksum length does not fit {alg} ({len} hex digits: {})",
                and_list(&fits)
            ),
        };
        self.malformed(tally, err, &why)
    }

    /// Parse the line `buf`, hash the image it names and compare, saying
    /// OK or FAILED as sha256sum does; count it in `tally`.
    fn check(
        &self,
        buf: &[u8],
        tally: &mut Tally,
        compute: &mut dyn FnMut(&OsStr, Tag) -> io::Result<Checksum>,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> io::Result<()> {
        let opts = self.opts;
        let Some(Entry {
            name,
            hex,
            construction,
            algorithm,
            block_size,
        }) = lines::parse_line_bytes(buf)
        else {
            if tally.foreign_tag.is_none() {
                tally.foreign_tag = foreign_tag(buf);
            }
            return self.malformed(tally, err, "improperly formatted blkhash checksum line");
        };
        let alg = algorithm.unwrap_or(opts.algorithm);
        if hex.len() != 2 * alg.output_len() {
            // Only plain lines: a tagged line's length is checked as it is parsed.
            return self.unfit(hex.len(), alg, tally, err);
        }
        tally.any_line = true;
        let bs = block_size.unwrap_or(opts.block_size);
        if let (Some(a), Some(b)) = (algorithm, block_size)
            && !tally.tags.contains(&(a, b))
        {
            tally.tags.push((a, b));
        }
        let c = construction.unwrap_or(opts.construction);
        match compute(&name, (c, alg, bs)) {
            Ok(sum)
                if Checksum::from_hex(alg, &hex)
                    .is_ok_and(|want| want.with_construction(c) == sum) =>
            {
                tally.verified += 1;
                tally.untagged_verified += usize::from(algorithm.is_none());
                if !opts.quiet && !opts.status {
                    say(out, &name, "OK")?;
                }
            }
            Ok(_) => {
                tally.verified += 1;
                tally.mismatched += 1;
                if algorithm.is_none() {
                    tally.untagged_verified += 1;
                    tally.untagged_mismatched += 1;
                    tally.failed_len.get_or_insert(hex.len());
                }
                if !opts.status {
                    say(out, &name, "FAILED")?;
                }
            }
            Err(e) if opts.ignore_missing && e.kind() == io::ErrorKind::NotFound => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Err(e),
            Err(e) => {
                tally.unreadable += 1;
                let lossy = blkcli::shown_lossy(&name);
                writeln!(err, "blksum: {lossy}: {}", blkcli::units::reason(&e))?;
                if !opts.status {
                    say(out, &name, "FAILED open or read")?;
                }
            }
        }
        out.flush()
    }
}

/// The end of a checksum file: the warnings sha256sum prints, the hints
/// that say which options would check lines made with others, and whether
/// the file verified.
fn summarize(
    list_name: &str,
    opts: &CheckOptions,
    tally: Tally,
    err: &mut dyn Write,
) -> io::Result<bool> {
    let used = (opts.algorithm, opts.block_size);
    let hints = |err: &mut dyn Write, tally: &Tally, failed: &str| -> io::Result<()> {
        if opts.status {
            return Ok(());
        }
        if let Some(len) = tally.failed_len {
            let hint = options_hint(list_name, len, used, &tally.tags);
            writeln!(err, "blksum: {list_name}: {failed}{hint}")?;
        }
        if let Some(tag) = &tally.foreign_tag {
            writeln!(err, "blksum: {list_name}: {}", foreign_hint(tag))?;
        }
        Ok(())
    };
    if !tally.any_line {
        writeln!(
            err,
            "blksum: {list_name}: no properly formatted checksum lines found"
        )?;
        hints(err, &tally, "")?;
        return Ok(false);
    }
    if !opts.status {
        warnings(&tally, err)?;
    }
    // Every image of a plain line (which does not say how it was made) read
    // and none matched, or no plain line fit the digest: the images changed
    // (or were damaged) since, or the list was made with other options, or
    // by another tool; say so, first the images, and which options would
    // check them.
    let all_failed = tally.untagged_mismatched > 0
        && tally.untagged_mismatched == tally.untagged_verified
        || tally.unfit > 0 && tally.untagged_verified == 0;
    let failed = match (
        tally.verified == tally.mismatched,
        tally.untagged_mismatched > 0,
    ) {
        (true, true) => {
            "no listed image matched: the images may have changed since the list was made, \
             or be damaged; or the list was made otherwise: "
        }
        (false, true) => {
            "no image of an untagged line matched: those images may have changed since the \
             list was made, or be damaged; or those lines were made otherwise: "
        }
        (_, false) => "",
    };
    let tally = Tally {
        failed_len: tally.failed_len.filter(|_| all_failed),
        ..tally
    };
    hints(err, &tally, failed)?;
    if opts.ignore_missing && tally.verified == 0 && tally.unreadable == 0 {
        writeln!(err, "blksum: {list_name}: no file was verified")?;
        return Ok(false);
    }
    Ok(tally.unreadable == 0 && tally.mismatched == 0 && !(opts.strict && tally.malformed > 0))
}

/// sha256sum's warnings: lines improperly formatted, files unreadable,
/// checksums that did not match.
fn warnings(tally: &Tally, err: &mut dyn Write) -> io::Result<()> {
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
    Ok(())
}

#[cfg(test)]
mod tests;
