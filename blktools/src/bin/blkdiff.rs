//! blkdiff: where two images (or saved block maps) differ.

// Messages go through blkcli::say!, which never panics on a closed
// standard error (`cmd 2>&1 | head -1`).
#![deny(clippy::print_stderr)]

use blkcli::args::InputArgs;
use blkcli::manual::Page;
use blkcli::output::{Form, Stdout};
use blkcli::progress::Progress;
use blkcli::units::reason;
use blkjob::{Job, StdinMap};
use blkmap::{Diff, Header, MapLike};
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
/// rest of the larger one is the last line: "OFFSET+LENGTH only in A|B".
/// Ranges are whole blocks (clipped to the image size): a smaller block
/// size finds smaller ranges, at the cost of more digests.
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
            "A and B hold the same content (a hole and written zeros are the same).",
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
    let maps = match saved_maps(&args, detect) {
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
    let (ra, rb) = hash_both(&args, maps, [&job, &job_b], detect, &progress);
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
    Written(blkmap::MapFile, blkjob::Written),
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
}

/// A and B that are saved maps (where the format is probed and the input
/// is not standard input), opened.
fn saved_maps(args: &Args, detect: [bool; 2]) -> Result<[Option<Side>; 2], String> {
    let mut maps: [Option<Side>; 2] = [None, None];
    for ((slot, (path, name)), detect) in maps
        .iter_mut()
        .zip([(&args.a_path, &args.a), (&args.b_path, &args.b)])
        .zip(detect)
    {
        if !detect || path == "-" {
            continue;
        }
        // A PBS fixed index is streamed into a map in a temporary file
        // (32 bytes a chunk), checked against its index_csum on the way.
        match blkjob::try_open_map(path) {
            Ok(Some((map, format))) => match map.header().whole() {
                Ok(_) => *slot = Some(Side::Saved(map, format)),
                Err(e) => return Err(format!("{name}: {e}")),
            },
            Ok(None) => {}
            Err(e) => return Err(format!("{name}: {}", reason(&e))),
        }
    }
    Ok(maps)
}

/// The maps of A and B: saved ones as they are, images hashed both at once
/// (each uses every core for digests, but reading one need not wait for
/// the other).
fn hash_both(
    args: &Args,
    [ma, mb]: [Option<Side>; 2],
    [job_a, job_b]: [&Job; 2],
    detect: [bool; 2],
    progress: &Progress,
) -> (io::Result<Side>, io::Result<Side>) {
    let side = |m: Option<Side>, name: &OsString, job: &Job, detect| -> io::Result<Side> {
        match m {
            Some(m) => Ok(m),
            None if name == "-" => progress
                .track("-", None, |p| blkjob::map_stdin(job, detect, p))
                .and_then(|m| match m {
                    StdinMap::Saved(map, format) => {
                        map.header().whole().map_err(io::Error::other)?;
                        Ok(Side::Saved(map, format))
                    }
                    StdinMap::Written(map, written) => Ok(Side::Written(map, written)),
                }),
            None => {
                let input = job.open(name)?;
                progress
                    .track(&blkcli::shown_lossy(name), input.size(), |p| {
                        blkjob::map_to_temp(input, job, job.cancel(), p)
                    })
                    .map(|(file, written)| Side::Written(file, written))
            }
        }
    };
    let ma = std::sync::Mutex::new(ma);
    let side_a = || {
        let m = ma.lock().unwrap_or_else(|p| p.into_inner()).take();
        side(m, &args.a_path, job_a, detect[0])
    };
    std::thread::scope(|s| {
        // At the system's limit on threads, one after the other.
        let ha = std::thread::Builder::new().spawn_scoped(s, side_a);
        let rb = side(mb, &args.b_path, job_b, detect[1]);
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
    if d.is_same() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The digest and block size: asked for, else the saved maps', else the
/// defaults. Every map must agree.
fn params(args: &Args, maps: &[Option<Side>; 2]) -> Result<Job, String> {
    let first = maps.iter().flatten().next().map(Side::header);
    let job = args.input.job(first.map(|h| (h.algorithm, h.block_size)));
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
        writeln!(
            out,
            "{t} only in {} (A is {} bytes, B is {} bytes)",
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
            // blkdiff's first spelling, kept while the schema is 1.
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
        "schema": 1,
        "a": input(&args.a, &args.a_path, a)?,
        "b": input(&args.b, &args.b_path, b)?,
        "construction": construction.name(),
        "digest": a.header().algorithm.name(),
        "block-size": a.header().block_size,
        "same": d.is_same(),
        "ranges": d.ranges.iter().map(|r| json!({"offset": r.offset, "length": r.len})).collect::<Vec<_>>(),
        "tail": d.tail().map(|t| json!({
            "offset": t.offset,
            "length": t.len,
            "only-in": only_in(d).to_ascii_lowercase(),
        })),
        "differing-bytes": d.differing_bytes(),
    }))
}
