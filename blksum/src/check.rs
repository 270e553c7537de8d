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
mod tests {
    use super::*;
    use blkhash::{Hasher, Options};

    /// "Images" are names whose content is the name itself; "missing" does not exist.
    fn compute(name: &OsStr, (c, alg, bs): Tag) -> io::Result<Checksum> {
        if name.as_bytes().starts_with(b"missing") {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        let opts = Options::new().construction(c).algorithm(alg).block_size(bs);
        let mut h = Hasher::with_options(opts.threads(1)).unwrap();
        h.update(name.as_bytes());
        Ok(h.finalize())
    }

    fn sum(name: &str, alg: Algorithm, bs: usize) -> String {
        sum_in(Construction::Blkhash, name, alg, bs)
    }

    fn sum_in(c: Construction, name: &str, alg: Algorithm, bs: usize) -> String {
        compute(OsStr::new(name), (c, alg, bs)).unwrap().to_hex()
    }

    #[test]
    fn tags_name_the_construction() {
        let c = Construction::Imageio;
        let (alg, bs) = (Algorithm::Blake2b256, 4 << 20);
        let good = sum_in(c, "a.img", alg, bs);
        let list = lines::format_line(&good, "a.img", Some((c, alg, bs)));
        let (ok, out, _) = run(&list, &opts());
        assert!(ok, "{out}");
        // The same digest in blkhash 0.11's construction is another checksum.
        let other = sum("a.img", alg, bs);
        let list = lines::format_line(&other, "a.img", Some((c, alg, bs)));
        assert!(!run(&list, &opts()).0);
        // Untagged lines take the command line's construction.
        let plain = CheckOptions {
            construction: c,
            algorithm: alg,
            block_size: bs,
            ..Default::default()
        };
        assert!(run(&format!("{good}  a.img\n"), &plain).0);
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
                "sums: no listed image matched: the images may have changed since the list was \
                 made, or be damaged; or the list was made otherwise: the checksums are 64 hex \
                 digits, as sha256, \
                 sha512-256, sha3-256, blake2b-256, blake2s256, sm3, shake256 and blake3 write \
                 them, made \
                 with another --digest or --block-size? (`blksum -c -d blake3 --block-size 1m \
                 sums` checks them if they were made so) Or checksums of another construction"
            ),
            "{err}"
        );
        // One match, or a tagged line (it says how it was made): no such hint.
        let good = sum("a.img", Algorithm::Sha256, 65536);
        let (_, _, err) = run(&format!("{good}  a.img\n{list}"), &opts());
        assert!(!err.contains("another construction"), "{err}");
        let tagged = lines::format_line(
            &"0".repeat(64),
            "a.img",
            Some((Construction::Blkhash, Algorithm::Sha256, 65536)),
        );
        let (_, _, err) = run(&format!("{tagged}\n"), &opts());
        assert!(!err.contains("another construction"), "{err}");
    }

    #[test]
    fn a_list_whose_images_all_changed_says_so_first() {
        // Made by blksum with the default options, of images that have
        // changed since (their content is their name: another name).
        let list = format!(
            "{}  a.img\n{}  b.img\n",
            sum("a.img.before", Algorithm::Sha256, 65536),
            sum("b.img.before", Algorithm::Sha256, 65536)
        );
        let (ok, out, err) = run(&list, &opts());
        assert!(!ok);
        assert_eq!(out, "a.img: FAILED\nb.img: FAILED\n");
        let hint = err
            .lines()
            .find(|l| l.contains("no listed image matched"))
            .unwrap();
        let changed = hint.find("may have changed since the list was made, or be damaged");
        let options = hint.find("another --digest or --block-size");
        assert!(changed.is_some() && changed < options, "{err}");
    }

    /// `names`' plain lines as blksum writes them with `alg` and `bs`.
    fn plain_list(names: &[&str], alg: Algorithm, bs: usize) -> String {
        names
            .iter()
            .map(|n| format!("{}  {n}\n", sum(n, alg, bs)))
            .collect()
    }

    #[test]
    fn a_list_made_with_other_options_names_them() {
        // Made with -d blake3 --block-size 1m, checked without: the same
        // length as sha256's, so the lines are read and nothing matches.
        let list = plain_list(&["a.img", "b.img"], Algorithm::Blake3, 1 << 20);
        let (ok, _, err) = run(&list, &opts());
        assert!(!ok);
        assert!(err.contains("64 hex digits, as sha256, "), "{err}");
        assert!(
            err.contains("`blksum -c -d blake3 --block-size 1m sums`"),
            "{err}"
        );
        // Checked with them, it verifies.
        let made = CheckOptions {
            algorithm: Algorithm::Blake3,
            block_size: 1 << 20,
            ..opts()
        };
        assert!(run(&list, &made).0);

        // Made with sha512: no line fits sha256, and the digests that
        // write 128 hex digits are named, on each line with --warn too.
        let list = plain_list(&["a.img"], Algorithm::Sha512, 65536);
        let (ok, _, err) = run(&list, &opts());
        assert!(!ok);
        assert!(
            err.contains("sums: no properly formatted checksum lines found\n"),
            "{err}"
        );
        assert!(
            err.contains(
                "sums: the checksums are 128 hex digits, as sha512, sha3-512 and blake2b512 \
                 write them, not sha256: made with another --digest? (`blksum -c -d sha512 \
                 sums` checks them if they were made so, with --block-size too if their blocks \
                 were not of 64k)"
            ),
            "{err}"
        );
        let warn = CheckOptions {
            warn: true,
            ..opts()
        };
        let (_, _, err) = run(&list, &warn);
        assert!(
            err.contains(
                "sums: 1: checksum length does not fit sha256 (128 hex digits: sha512, \
                 sha3-512 and blake2b512)"
            ),
            "{err}"
        );
        // --status: nothing but what sha256sum says too.
        let status = CheckOptions {
            status: true,
            ..opts()
        };
        let (_, _, err) = run(&list, &status);
        assert_eq!(
            err,
            "blksum: sums: no properly formatted checksum lines found\n"
        );
    }

    #[test]
    fn a_tagged_line_gives_the_exact_options_for_the_plain_ones() {
        let (alg, bs) = (Algorithm::Blake3, 1 << 20);
        let tagged = lines::format_line(
            &sum("a.img", alg, bs),
            "a.img",
            Some((Construction::Blkhash, alg, bs)),
        );
        let list = format!("{tagged}\n{}", plain_list(&["b.img"], alg, bs));
        let (ok, out, err) = run(&list, &opts());
        assert!(!ok);
        assert_eq!(out, "a.img: OK\nb.img: FAILED\n");
        assert!(
            err.contains(
                "sums: no image of an untagged line matched: those images may have changed \
                 since the list was made, or be damaged; or those lines were made otherwise: \
                 its tagged lines were made with \
                 -d blake3 and blocks of 1m: `blksum -c -d blake3 --block-size 1m sums` checks \
                 the untagged ones if they were made so too"
            ),
            "{err}"
        );
    }

    #[test]
    fn bsd_lines_of_other_tools_are_named() {
        let hex = "ab".repeat(32);
        let (ok, _, err) = run(&format!("SHA256 (a.img) = {hex}\n"), &opts());
        assert!(!ok);
        assert!(
            err.contains(
                "sums: lines such as 'SHA256 (NAME) = HEX' are the BSD-style lines of \
                 sha256sum --tag or cksum"
            ),
            "{err}"
        );
        assert!(
            err.contains("blksum --tag writes 'blkhash/sha256 (NAME) = HEX'"),
            "{err}"
        );
        assert_eq!(
            foreign_tag(b"BLAKE2b (x (1)) = 00ff"),
            Some("BLAKE2b".into())
        );
        for not in [&b"a (b) = xyz"[..], b"a b (c) = 00", b" (c) = 00", b"ab  c"] {
            assert_eq!(foreign_tag(not), None, "{:?}", String::from_utf8_lossy(not));
        }
    }

    #[test]
    fn tagged_lines_need_no_options() {
        let alg = Algorithm::Blake3;
        let line = lines::format_line(
            &sum("x", alg, 4096),
            "x",
            Some((Construction::Blkhash, alg, 4096)),
        );
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
            &mut |_, _| {
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
