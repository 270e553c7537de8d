//! blkdiff: where two images (or saved block maps) differ.

use blkcli::args::InputArgs;
use blkcli::manual::Page;
use blkcli::progress::Progress;
use blkcli::units::reason;
use blkjob::{Job, Mapped};
use blkmap::{Diff, Map};
use clap::Parser;
use serde_json::json;
use std::ffi::OsString;
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

    /// Digest, block size, threads, and the format of both (with -f, a
    /// file starting with the map magic is an image too).
    #[command(flatten)]
    input: InputArgs,

    /// B's format, when it is not -f's (as qemu-img compare's -F; with -F
    /// alone, A is probed and B is not a map).
    #[arg(short = 'F', long, value_name = "FORMAT", value_parser = blkcli::args::format_parser(), hide_possible_values = true)]
    b_format: Option<blkimage::Format>,

    #[command(flatten)]
    show: blkcli::progress::ShowArgs,
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
    eprintln!("blkdiff: {msg}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    if let Some(code) = blkcli::manual::early::<Args>(&PAGE) {
        return code;
    }
    let mut args: Args = blkcli::args::parse_map_args(command(), |a: &Args| &a.input);
    args.json |= args.output.as_deref() == Some("json");
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
            eprintln!("blkdiff: interrupted");
            return ExitCode::from(signals.exit_status());
        }
        (Err(e), _) => return trouble(format!("{}: {}", args.a, reason(&e))),
        (_, Err(e)) => return trouble(format!("{}: {}", args.b, reason(&e))),
    };
    compare(&args, &a, &b, &job)
}

/// A and B that are saved maps (where the format is probed and the input
/// is not standard input), loaded.
fn saved_maps(args: &Args, detect: [bool; 2]) -> Result<[Option<Mapped>; 2], String> {
    let mut maps: [Option<Mapped>; 2] = [None, None];
    for ((slot, (path, name)), detect) in maps
        .iter_mut()
        .zip([(&args.a_path, &args.a), (&args.b_path, &args.b)])
        .zip(detect)
    {
        if !detect || path == "-" {
            continue;
        }
        match blkjob::try_load_map(path) {
            Ok(Some(map)) => {
                *slot = Some(Mapped {
                    map,
                    format: "map".into(),
                    rounded: None,
                    stats: Default::default(),
                })
            }
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
    [ma, mb]: [Option<Mapped>; 2],
    [job_a, job_b]: [&Job; 2],
    detect: [bool; 2],
    progress: &Progress,
) -> (io::Result<Mapped>, io::Result<Mapped>) {
    let side = |m: Option<Mapped>, name: &OsString, job: &Job, detect| -> io::Result<Mapped> {
        match m {
            Some(m) => Ok(m),
            None if name == "-" => progress.track("-", None, |p| blkjob::map_stdin(job, detect, p)),
            None => {
                let input = job.open(name)?;
                progress.track(&blkcli::shown_lossy(name), input.size(), |p| {
                    blkjob::map(input, job, job.cancel(), p)
                })
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
fn compare(args: &Args, a: &Mapped, b: &Mapped, job: &Job) -> ExitCode {
    // A raw file hashed at QEMU's size, not its own: said once per input
    // (not with -q, which prints nothing).
    for (m, name) in [(a, &args.a), (b, &args.b)] {
        if let Some(r) = m.rounded.filter(|_| !args.quiet) {
            eprintln!("blkdiff: {name}: {r}");
        }
    }
    // Standard input may have been a map of other parameters.
    for (m, name) in [(a, &args.a), (b, &args.b)] {
        if let Err(msg) = check_map(name, &m.map, job) {
            return trouble(msg);
        }
    }
    let d = match blkmap::diff(&a.map, &b.map) {
        Ok(d) => d,
        Err(e) => return trouble(e),
    };
    let printed = if args.quiet {
        Ok(())
    } else if args.json {
        print_json(args, a, b, &d, job.construction())
    } else {
        print_text(&d)
    };
    // Trouble (2), said unless the reader went away.
    if let Err(e) = printed {
        blkcli::output::failed("blkdiff", &e);
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
fn params(args: &Args, maps: &[Option<Mapped>; 2]) -> Result<Job, String> {
    let first = maps.iter().flatten().next().map(|m| &m.map);
    let job = args
        .input
        .job(first.map(|m| (m.algorithm(), m.block_size())));
    for (m, name) in maps.iter().zip([&args.a, &args.b]) {
        if let Some(m) = m {
            check_map(name, &m.map, &job)?;
        }
    }
    Ok(job)
}

fn check_map(name: &str, map: &Map, job: &Job) -> Result<(), String> {
    match blkjob::map_mismatch(map, job.algorithm(), job.block_size()) {
        Some(why) => Err(format!(
            "{name}: {why}: map the images again with the same --digest and --block-size"
        )),
        None => Ok(()),
    }
}

fn only_in(d: &Diff) -> &'static str {
    if d.size_a > d.size_b { "A" } else { "B" }
}

fn print_text(d: &Diff) -> io::Result<()> {
    let mut out = io::BufWriter::new(io::stdout().lock());
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

fn print_json(
    args: &Args,
    a: &Mapped,
    b: &Mapped,
    d: &Diff,
    construction: blkhash::Construction,
) -> io::Result<()> {
    let input = |name: &str, m: &Mapped| {
        json!({
            "name": name,
            "format": m.format,
            "virtual-size": m.map.size(),
            // blkdiff's first spelling, kept while the schema is 1.
            "size": m.map.size(),
            "checksum": m.map.checksum_in(construction).to_hex(),
        })
    };
    // Keys as blksum's --json spells them (qemu-img's style), in the order
    // written here (serde_json's preserve_order); schema as its.
    let doc = json!({
        "schema": 1,
        "a": input(&args.a, a),
        "b": input(&args.b, b),
        "construction": construction.name(),
        "digest": a.map.algorithm().name(),
        "block-size": a.map.block_size(),
        "same": d.is_same(),
        "ranges": d.ranges.iter().map(|r| json!({"offset": r.offset, "length": r.len})).collect::<Vec<_>>(),
        "tail": d.tail().map(|t| json!({
            "offset": t.offset,
            "length": t.len,
            "only-in": only_in(d).to_ascii_lowercase(),
        })),
        "differing-bytes": d.differing_bytes(),
    });
    let mut out = io::stdout().lock();
    writeln!(out, "{doc:#}")?;
    out.flush()
}
