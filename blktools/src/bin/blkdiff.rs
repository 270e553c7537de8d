//! blkdiff: where two images (or saved block maps) differ.

// Messages go through blkcli::say!, which never panics on a closed
// standard error (`cmd 2>&1 | head -1`).
#![deny(clippy::print_stderr)]

use blkcli::args::InputArgs;
use blkcli::manual::Page;
use blkcli::output::{Form, Stdout};
use blkcli::progress::Progress;
use blkcli::units::reason;
use blkimage::Input;
use blkjob::Job;
use blkmap::{Diff, Header, MapLike, SizeRule};
use clap::Parser;
use serde_json::json;
use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::process::ExitCode;

/// Print where two images, or saved block maps, differ.
///
/// The guest ranges where A and B differ are printed as OFFSET+LENGTH lines in
/// bytes, adjacent differing blocks merged. Exit status as cmp: 0 same, 1
/// different, 2 trouble.
///
/// A and B are images (any input blksum reads) or block maps saved by
/// blkmap (a file starting with the map magic, unless --format is given).
/// A hole and written zeros are the same content. If the sizes differ, the
/// rest of the larger one is the last line: "OFFSET+LENGTH only in A|B,
/// all zeros" or "..., data at OFFSET" (its first block that is not
/// zeros). As qemu-img compare without -s, a rest of zeros is no
/// difference: a disk grown past its source (a PVC that CDI resized after
/// writing the image) holds the same content, exit status 0; --strict
/// counts any difference in size. Ranges are whole blocks (clipped to the
/// image size): a smaller block size finds smaller ranges, at the cost of
/// more digests; when the smaller size is not a multiple of the block
/// size, its last block differs from the larger one's whole block (a
/// block size that divides it compares it).
///
/// Images are hashed with the digest and block size of the maps given, or
/// --digest and --block-size (sha256 and 64k by default); a map of another
/// digest or block size than asked for is an error.
#[derive(Parser, Debug)]
#[command(name = "blkdiff", version, max_term_width = 100)]
struct Args {
    /// First image or map ('-' for standard input).
    #[arg(value_name = "A")]
    a_path: OsString,

    /// Second image or map.
    #[arg(value_name = "B")]
    b_path: OsString,

    /// A and B as messages name them (file names need not be UTF-8).
    #[arg(skip)]
    a: String,
    #[arg(skip)]
    b: String,

    /// One JSON document: both inputs, the ranges, the tail, the verdict.
    #[arg(long)]
    json: bool,

    /// The output format, as qemu-img's --output: human (OFFSET+LENGTH
    /// lines, the default) or json (as --json).
    #[arg(long, value_name = "FORMAT", value_parser = ["human", "json"], conflicts_with_all = ["json", "quiet"])]
    output: Option<String>,

    /// Print nothing; the exit status tells.
    #[arg(short, long, conflicts_with = "json")]
    quiet: bool,

    /// Images of different sizes differ, even if the larger one holds only
    /// zeros past the smaller one's end (as qemu-img compare -s).
    #[arg(short, long)]
    strict: bool,

    /// Ranges or the JSON document (--json, --output json).
    #[arg(skip)]
    form: Form,

    /// Digest, block size, threads, and the format of both (with -f, a
    /// file starting with the map magic is an image too).
    #[command(flatten)]
    input: InputArgs,

    /// B's format, when it is not -f's (as qemu-img compare's -F; with -F
    /// alone, A is probed and B is not a map).
    #[arg(short = 'F', long, value_name = "FORMAT", value_parser = blkcli::args::format_parser(), hide_possible_values = true)]
    b_format: Option<blkimage::Format>,

    #[command(flatten)]
    show: blkcli::args::ShowArgs,
}

/// The command, with `-h` a summary: the options a user reaches for first.
fn command() -> clap::Command {
    use blkcli::help::*;
    let shown = [
        ("json", "One JSON document instead of the ranges"),
        ("quiet", "Print nothing; the exit status tells"),
        (
            "strict",
            "Different sizes differ, even with a tail of zeros",
        ),
        CONSTRUCTION,
        DIGEST,
        BLOCK_SIZE,
        FORMAT,
        ("b_format", "B's format, when it is not -f's"),
        NO_BACKING,
        FORCE_SHARE,
        CACHE,
        PROGRESS,
    ];
    summarize(<Args as clap::CommandFactory>::command(), &shown)
}

const PAGE: Page = Page {
    exit_status: &[
        (
            "0",
            "A and B hold the same content (a hole and written zeros are the same; \
             without --strict, the larger may hold zeros past the smaller one's end).",
        ),
        ("1", "They differ."),
        (
            "2",
            "Trouble: an input could not be read, maps that cannot be compared, a usage error.",
        ),
        ("130, 143", "Stopped by SIGINT (Ctrl-C) or SIGTERM."),
    ],
    examples: &[
        (
            "Did a conversion keep the content?",
            "blkdiff disk.raw disk.qcow2",
        ),
        (
            "What changed since a saved map, as JSON:",
            "blkdiff --json yesterday.map disk.qcow2",
        ),
        ("In a script:", "blkdiff -q a.img b.img || echo differ"),
        (
            "Does a PVC hold its source's content, zeros past its end allowed?",
            "blkdiff source.qcow2 /pvc/disk.img",
        ),
    ],
};

/// Trouble: exit status 2.
fn trouble(msg: impl std::fmt::Display) -> ExitCode {
    blkcli::say!("blkdiff: {msg}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    blkhash::one_heap_under_a_limit();
    if let Some(code) = blkcli::manual::early::<Args>(&PAGE) {
        return code;
    }
    let mut args: Args = blkcli::args::parse_map_args(command(), |a: &Args| &a.input);
    args.form = Form::from_flags(args.json, args.output.as_deref());
    args.a = blkcli::shown_lossy(&args.a_path);
    args.b = blkcli::shown_lossy(&args.b_path);
    if args.a == "-" && args.b == "-" {
        return trouble("standard input can be only one of A and B");
    }
    let b_format = args.b_format.or(args.input.format);
    let detect = [args.input.format.is_none(), b_format.is_none()];

    // Saved maps first: they say how to hash the images.
    let (maps, stdin) = match saved_maps(&args, detect) {
        Ok(maps) => maps,
        Err(msg) => return trouble(msg),
    };
    let job = match params(&args, &maps) {
        Ok(job) => job,
        Err(msg) => return trouble(msg),
    };
    let signals = blkcli::signals::Signals::install("blkdiff: interrupted");
    let job = job.with_cancel(signals.cancel.clone());
    // Saved maps are not hashed: only the images count.
    let hashed = maps.iter().filter(|m| m.is_none()).count();
    let progress = match Progress::new("blkdiff", args.show.progress.progress, Some(hashed)) {
        Ok(p) => p,
        Err(msg) => return trouble(msg),
    };
    let mut spec_b = job.spec();
    spec_b.open.format = b_format;
    let job_b = match spec_b.build() {
        Ok(job) => job,
        Err(msg) => return trouble(msg),
    };
    let (ra, rb) = hash_both(&args, maps, stdin, [&job, &job_b], &progress);
    let (a, b) = match (ra, rb) {
        (Ok(a), Ok(b)) => (a, b),
        _ if signals.cancelled() => {
            blkcli::say!("blkdiff: interrupted");
            return ExitCode::from(signals.exit_status());
        }
        (Err(e), _) => return trouble(format!("{}: {}", args.a, reason(&e))),
        (_, Err(e)) => return trouble(format!("{}: {}", args.b, reason(&e))),
    };
    compare(&args, &a, &b, &job)
}

/// A side of the comparison, a map read where it lies (streamed, never
/// loaded whole): saved, or of an input hashed now.
enum Side {
    /// A saved map, or a PBS fixed index as a map in a temporary file,
    /// and which ("map" or "fidx").
    Saved(blkmap::MapFile, &'static str),
    /// An image's map, written to an unnamed temporary file as it was
    /// made.
    Written(blkmap::MapFile, Box<blkjob::Written>),
}

impl Side {
    fn map(&self) -> &dyn MapLike {
        match self {
            Side::Saved(m, _) | Side::Written(m, _) => m,
        }
    }

    fn header(&self) -> Header {
        self.map().header().into_owned()
    }

    fn format(&self) -> &str {
        match self {
            Side::Saved(_, format) => format,
            Side::Written(_, w) => &w.format,
        }
    }

    fn rounded(&self) -> Option<blkimage::Rounded> {
        match self {
            Side::Saved(..) => None,
            Side::Written(_, w) => w.rounded,
        }
    }

    fn decompressed(&self) -> Option<&blkimage::Decompressed> {
        match self {
            Side::Saved(..) => None,
            Side::Written(_, w) => w.decompressed.as_ref(),
        }
    }
}

/// A and B that are saved maps (where the format is probed), opened; and
/// standard input, if it is one of them and not a map: the stream to
/// hash. Standard input is read first as a map too, so that an index or
/// a map piped in says the digest and block size as one named does.
#[allow(clippy::type_complexity)]
fn saved_maps(
    args: &Args,
    detect: [bool; 2],
) -> Result<([Option<Side>; 2], Option<Box<dyn io::Read + Send>>), String> {
    let mut maps: [Option<Side>; 2] = [None, None];
    let mut stdin = None;
    for ((slot, (path, name)), detect) in maps
        .iter_mut()
        .zip([(&args.a_path, &args.a), (&args.b_path, &args.b)])
        .zip(detect)
    {
        if !detect {
            continue;
        }
        if path == "-" {
            match blkjob::stdin_saved(&args.input.open_options()) {
                Ok(Ok((map, format))) => match map.header().whole() {
                    Ok(_) => *slot = Some(Side::Saved(map, format)),
                    Err(e) => return Err(format!("{name}: {e}")),
                },
                Ok(Err(stream)) => stdin = Some(stream),
                Err(e) => return Err(format!("{name}: {}", reason(&e))),
            }
            continue;
        }
        // A PBS fixed index is streamed into a map in a temporary file
        // (32 bytes a chunk), checked against its index_csum on the way.
        match blkjob::try_open_map(path, &args.input.open_options()) {
            Ok(Some((map, format))) => match map.header().whole() {
                Ok(_) => *slot = Some(Side::Saved(map, format)),
                Err(e) => return Err(format!("{name}: {e}")),
            },
            Ok(None) => {}
            Err(e) => return Err(format!("{name}: {}", reason(&e))),
        }
    }
    Ok((maps, stdin))
}

/// The maps of A and B: saved ones as they are, images hashed both at once
/// (each uses every core for digests, but reading one need not wait for
/// the other).
fn hash_both(
    args: &Args,
    [ma, mb]: [Option<Side>; 2],
    stdin: Option<Box<dyn io::Read + Send>>,
    [job_a, job_b]: [&Job; 2],
    progress: &Progress,
) -> (io::Result<Side>, io::Result<Side>) {
    // Standard input not read yet (its format given: never a map).
    let stdin = std::sync::Mutex::new(stdin);
    let side = |m: Option<Side>, name: &OsString, job: &Job| -> io::Result<Side> {
        match m {
            Some(m) => Ok(m),
            None if name == "-" => {
                let stream = stdin.lock().unwrap_or_else(|p| p.into_inner()).take();
                let stream = stream.unwrap_or_else(|| Box::new(io::stdin()));
                progress
                    .track("-", None, |p| {
                        blkjob::map_to_temp(Input::Stream(stream), job, job.cancel(), p)
                    })
                    .map(|(file, written)| Side::Written(file, Box::new(written)))
            }
            None => {
                let input = job.open(name)?;
                progress
                    .track(&blkcli::shown_lossy(name), input.size(), |p| {
                        blkjob::map_to_temp(input, job, job.cancel(), p)
                    })
                    .map(|(file, written)| Side::Written(file, Box::new(written)))
            }
        }
    };
    let ma = std::sync::Mutex::new(ma);
    let side_a = || {
        let m = ma.lock().unwrap_or_else(|p| p.into_inner()).take();
        side(m, &args.a_path, job_a)
    };
    std::thread::scope(|s| {
        // At the system's limit on threads, one after the other.
        let ha = std::thread::Builder::new().spawn_scoped(s, side_a);
        let rb = side(mb, &args.b_path, job_b);
        let ra = match ha {
            Ok(h) => h.join().expect("hashing thread"),
            Err(_) => side_a(),
        };
        (ra, rb)
    })
}

/// Compare the maps of A and B and print where they differ: the exit
/// status is cmp's.
fn compare(args: &Args, a: &Side, b: &Side, job: &Job) -> ExitCode {
    // A raw file hashed at QEMU's size, not its own: said once per input
    // (not with -q, which prints nothing).
    for (m, name) in [(a, &args.a), (b, &args.b)] {
        if let Some(r) = m.rounded().filter(|_| !args.quiet) {
            blkcli::say!("blkdiff: {name}: {r}");
        }
        if let Some(d) = m.decompressed().filter(|_| !args.quiet) {
            blkcli::say!("blkdiff: {name}: {d}");
        }
    }
    // Standard input may have been a map of other parameters.
    for (m, name) in [(a, &args.a), (b, &args.b)] {
        if let Err(msg) = check_map(name, &m.header(), job) {
            return trouble(msg);
        }
    }
    // Each map read through once, side by side, checked as it is read.
    let diffed = (|| {
        let pa = a.map().pieces().map_err(|e| e.of(&args.a))?;
        let pb = b.map().pieces().map_err(|e| e.of(&args.b))?;
        blkmap::diff_pieces(Named(pa, &args.a), Named(pb, &args.b))
    })();
    let d = match diffed {
        Ok(d) => d,
        Err(e) => return trouble(e),
    };
    let rule = args.rule();
    if !args.quiet
        && let Some(hint) = split_block_hint(&d, job.block_size())
    {
        blkcli::say!("blkdiff: {hint}");
    }
    let out = Stdout::new("blkdiff");
    let printed = match args.form {
        _ if args.quiet => Ok(()),
        Form::Json => match document(args, a, b, &d, job.construction()) {
            Ok(doc) => out.json(&doc),
            Err(e) => return trouble(e),
        },
        Form::Lines => out.write(|out| print_text(out, &d)),
    };
    // Trouble (2), said unless the reader went away.
    if printed.is_err() {
        return ExitCode::from(2);
    }
    if d.same(rule) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The digest and block size: asked for, else the saved maps', else the
/// defaults. Every map must agree.
fn params(args: &Args, maps: &[Option<Side>; 2]) -> Result<Job, String> {
    let first = maps.iter().flatten().next().map(Side::header);
    let mut spec = args.input.spec();
    // An encrypted backup's index holds keyed digests: the images are
    // hashed with its key (checked against its manifest when the index
    // was opened).
    spec.keyed = spec.open.keyfile.is_some()
        && maps
            .iter()
            .any(|m| matches!(m, Some(Side::Saved(_, "fidx"))));
    let job = InputArgs::resolve(spec, first.map(|h| (h.algorithm, h.block_size)));
    for (m, name) in maps.iter().zip([&args.a, &args.b]) {
        if let Some(m) = m {
            check_map(name, &m.header(), &job)?;
        }
    }
    Ok(job)
}

/// A side's pieces, their errors said of its name.
struct Named<'a, P>(P, &'a str);

impl<P: blkmap::Pieces> blkmap::Pieces for Named<'_, P> {
    fn header(&self) -> &Header {
        self.0.header()
    }
    fn next_piece(&mut self) -> Result<Option<blkmap::Piece<'_>>, blkmap::MapError> {
        let name = self.1;
        self.0.next_piece().map_err(|e| e.of(name))
    }
}

fn check_map(name: &str, map: &Header, job: &Job) -> Result<(), String> {
    match blkjob::header_mismatch(map, job.algorithm(), job.block_size()) {
        Some(why) => Err(format!(
            "{name}: {why}: map the images again with the same --digest and --block-size"
        )),
        None => Ok(()),
    }
}

impl Args {
    /// How a difference in size counts.
    fn rule(&self) -> SizeRule {
        if self.strict {
            SizeRule::Strict
        } else {
            SizeRule::ZeroTail
        }
    }
}

/// Why the last block of the smaller image differs, when it is short and
/// the only thing that kept a larger image with a tail of zeros from the
/// same content; with a block size that divides the smaller size (the
/// largest power of two that does, from 512 to 64m), if there is one.
fn split_block_hint(d: &Diff, block_size: usize) -> Option<String> {
    let common = d.size_a.min(d.size_b);
    let bs = block_size as u64;
    let [last] = &d.ranges[..] else { return None };
    if d.tail().is_none()
        || d.tail_data.is_some()
        || last.end() != common
        || last.len != common % bs
    {
        return None;
    }
    let fits = 1u64 << common.trailing_zeros().min(63);
    let hint = if fits >= 512 {
        format!("; --block-size {} compares it", fits.min(64 << 20))
    } else {
        String::new()
    };
    Some(format!(
        "{last} is the short last block of the smaller image ({common} bytes is not a \
         multiple of the block size, {bs}), compared with a whole block of the larger{hint}"
    ))
}

fn only_in(d: &Diff) -> &'static str {
    if d.size_a > d.size_b { "A" } else { "B" }
}

/// The differing ranges, a line each, then the tail.
fn print_text(out: &mut dyn Write, d: &Diff) -> io::Result<()> {
    let mut out = io::BufWriter::new(out);
    for r in &d.ranges {
        writeln!(out, "{r}")?;
    }
    if let Some(t) = d.tail() {
        let what = match d.tail_data {
            None => "all zeros".to_string(),
            Some(at) => format!("data at {at}"),
        };
        writeln!(
            out,
            "{t} only in {}, {what} (A is {} bytes, B is {} bytes)",
            only_in(d),
            d.size_a,
            d.size_b
        )?;
    }
    out.flush()
}

/// The JSON document of the comparison (each side's checksum in
/// `construction`: derived from its digests, read again, unless it is
/// blkhash 0.11's, which a map holds).
fn document(
    args: &Args,
    a: &Side,
    b: &Side,
    d: &Diff,
    construction: blkhash::Construction,
) -> Result<serde_json::Value, String> {
    let input = |name: &str, path: &OsStr, m: &Side| -> Result<serde_json::Value, String> {
        let h = m.header();
        let checksum = (m.map().pieces())
            .and_then(|p| blkmap::checksum_in(p, construction))
            .map_err(|e| format!("{name}: {e}"))?;
        let mut obj = json!({
            "name": name,
            "format": m.format(),
            "virtual-size": h.size,
            // blkdiff's first spelling, kept from schema 1.
            "size": h.size,
            "checksum": checksum.map(|c| c.to_hex()),
        });
        // A name that is not UTF-8, in full (`name` has U+FFFD).
        if let Some(escaped) = blkcli::lines::json_escaped(&blkcli::shown(path)) {
            obj["name-escaped"] = escaped.into();
        }
        Ok(obj)
    };
    // Keys as blksum's --json spells them (qemu-img's style), in the order
    // written here (serde_json's preserve_order); schema as its.
    Ok(json!({
        // 2: `same` and `differing-bytes` follow the size rule (a tail of
        // zeros is no difference without --strict).
        "schema": 2,
        "a": input(&args.a, &args.a_path, a)?,
        "b": input(&args.b, &args.b_path, b)?,
        "construction": construction.name(),
        "digest": a.header().algorithm.name(),
        "block-size": a.header().block_size,
        "same": d.same(args.rule()),
        "strict": args.strict,
        "ranges": d.ranges.iter().map(|r| json!({"offset": r.offset, "length": r.len})).collect::<Vec<_>>(),
        "tail": d.tail().map(|t| json!({
            "offset": t.offset,
            "length": t.len,
            "only-in": only_in(d).to_ascii_lowercase(),
            "zeros": d.tail_data.is_none(),
            "data-offset": d.tail_data,
        })),
        "differing-bytes": d.differing_bytes_under(args.rule()),
    }))
}
