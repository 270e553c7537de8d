//! blkmap: write the block map of an image (or of a range of it, a part),
//! merge parts, and print a map's checksum.

// Messages go through blkcli::say!, which never panics on a closed
// standard error (`cmd 2>&1 | head -1`).
#![deny(clippy::print_stderr)]

use blkcli::args::InputArgs;
use blkcli::manual::Page;
use blkcli::output::{self, LineStyle, Stdout};
use blkcli::progress::Progress;
use blkcli::signals::Signals;
use blkcli::units::{Span, parse_span, reason};
use blkjob::Job;
use clap::{Parser, Subcommand};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Write the block map of IMAGE to OUT and print the image's blkhash
/// checksum, as blksum does.
///
/// The map holds the digest, block size, virtual size and checksum of the
/// image, and per block its digest or a zero-block marker (runs stored as
/// runs): about 0.05% of the image for data (sha256, 64k blocks), next to
/// nothing for sparse ranges. `blkdiff` compares maps and images. OUT is
/// written atomically: a temporary file in its directory, flushed, renamed.
///
/// With --range, only part of the image is hashed and OUT is a part: parts
/// hashed anywhere (other hosts, other times) that cover the image once
/// merge into its map (`blkmap merge`), whose checksum is the image's.
#[derive(Parser, Debug)]
#[command(
    name = "blkmap",
    version,
    max_term_width = 100,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,

    /// The image: any input blksum reads ('-' for standard input).
    #[arg(value_name = "IMAGE", required = true)]
    image: Option<OsString>,

    /// Where to write the map.
    #[arg(value_name = "OUT", required = true)]
    out: Option<PathBuf>,

    /// Hash only these bytes and write them as a part: OFFSET+LENGTH (as
    /// blkdiff prints ranges; suffixes k, m, g), OFFSET+ to the end, or
    /// K/N, the K-th of N parts of about equal size (K from 1). OFFSET is a
    /// multiple of the block size; so is LENGTH, unless the range reaches
    /// the end of the image. Not for standard input (a pipe cannot seek).
    #[arg(long, value_name = "RANGE", value_parser = parse_span)]
    range: Option<Span>,

    /// Update OLD, the map of IMAGE when the dirty bitmap --dirty-bitmap
    /// was created or last cleared: hash only the blocks the bitmap marks
    /// dirty and take every other digest from OLD. OUT (which may be OLD)
    /// is the map a full run would write, and the checksum the same. OLD
    /// is checked first: same size, digest and block size; the files the
    /// image reads besides itself (backing chain, data file) the ones OLD
    /// recorded, unchanged (or the same NBD export); clean blocks whose
    /// allocation now contradicts OLD read and equal to OLD's; 16 clean
    /// blocks read again must hold what OLD says; a bitmap QEMU marks in
    /// use (inconsistent) or disabled is refused. A map written before
    /// OLD's record existed needs --verify.
    #[arg(
        long,
        value_name = "OLD",
        requires = "dirty_bitmap",
        conflicts_with = "range"
    )]
    base: Option<PathBuf>,

    /// The dirty bitmap that says which blocks changed since OLD: a qcow2
    /// image's persistent bitmap (qemu-img bitmap), or an NBD export's
    /// qemu:dirty-bitmap:NAME context (qemu-nbd -B NAME). `blkmap bitmaps
    /// IMAGE` lists them.
    #[arg(long, value_name = "NAME", requires = "base")]
    dirty_bitmap: Option<String>,

    /// With --base: read the clean blocks too, and fail (exit 1, OUT not
    /// written) if any changed without the bitmap marking it: an audit of
    /// the bitmap and OLD, at the cost of a full read.
    #[arg(long, requires = "base")]
    verify: bool,

    /// Print one JSON object (schema, image, checksum, digest, block-size,
    /// virtual-size, blocks, dirty-blocks, sampled-blocks,
    /// conflicting-blocks, read-bytes, checks) instead of the checksum line.
    #[arg(long, conflicts_with = "range")]
    json: bool,

    #[command(flatten)]
    input: InputArgs,

    #[command(flatten)]
    show: blkcli::args::ShowArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Merge parts (from --range) into the map OUT and print the checksum.
    /// The parts, given in any order, must cover the image exactly once and
    /// agree on its size, the digest and the block size. Parts are read as
    /// streams: memory stays about 1 MiB per part whatever the image's size.
    Merge {
        /// Where to write the map.
        #[arg(value_name = "OUT")]
        out: PathBuf,
        /// The parts.
        #[arg(value_name = "PART", required = true)]
        parts: Vec<PathBuf>,
        #[command(flatten)]
        line: LineArgs,
    },
    /// List the dirty bitmaps of IMAGE (a qcow2 image, or an NBD export's
    /// qemu:dirty-bitmap: contexts): name, granularity, flags (in-use:
    /// the writer died, the bitmap is refused; enabled or disabled). An
    /// NBD server says only the names ("-" for the rest).
    Bitmaps {
        /// The image or NBD URL.
        #[arg(value_name = "IMAGE")]
        image: OsString,
        /// One JSON array instead of lines.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        input: InputArgs,
    },
    /// Print the checksum of a map, or of parts that cover an image, as
    /// blksum prints it, checking the map on the way; nothing is written.
    /// MAP may be a Proxmox Backup Server fixed index (.fidx, probed by
    /// its magic: the map of the disk it backed up, sha256 digests of its
    /// chunks), its length and index_csum checked against its digests:
    /// the line holds its index_csum (what PBS shows as the file's csum,
    /// and `blksum --construction pbs DISK` gives for the disk it backed
    /// up) unless another --construction is asked for.
    Checksum {
        /// A map, or the parts of one.
        #[arg(value_name = "MAP", required = true)]
        maps: Vec<PathBuf>,
        #[command(flatten)]
        line: LineArgs,
    },
}

#[derive(clap::Args, Debug)]
struct LineArgs {
    /// The name the checksum line gives (say, the image's, to compare with
    /// blksum's output or to check with blksum -c); default: the map's
    /// (merge's OUT, or checksum's one MAP). The checksum of several parts
    /// needs it: they are no one file to name the line after.
    #[arg(long, value_name = "NAME")]
    name: Option<OsString>,
    /// Write a BSD-style line naming the construction, digest and block
    /// size, as blksum --tag.
    #[arg(long)]
    tag: bool,
    /// The checksum to print, computed from the block digests: blkhash
    /// (blkhash 0.11's, the one a map holds), imageio (oVirt imageio's
    /// checksum API), pbs (a Proxmox Backup Server index_csum: of a .fidx,
    /// its own, checked) [default: blkhash; pbs for a .fidx].
    #[arg(long, value_name = "NAME", value_parser = blkcli::args::construction_parser(), hide_possible_values = true)]
    construction: Option<blkhash::Construction>,
}

const PAGE: Page = Page {
    exit_status: &[
        (
            "0",
            "The map (or part) was written and the checksum printed (none for a part).",
        ),
        (
            "1",
            "The image could not be read, the parts do not make a map (a gap, an overlap, a mismatch, damage), a dirty bitmap or OLD was refused or --verify found a change the bitmap missed, or OUT could not be written (or would replace an input or a file that is not a map); OUT is left as it was.",
        ),
        ("2", "Usage error."),
        (
            "130, 143",
            "Stopped by SIGINT (Ctrl-C) or SIGTERM; OUT is left as it was.",
        ),
    ],
    examples: &[
        (
            "Map an image, then find what changed since:",
            "blkmap disk.qcow2 disk.map && blkdiff disk.map disk.qcow2",
        ),
        (
            "A finer map (smaller ranges in blkdiff), with blake3:",
            "blkmap --block-size 4k -d blake3 disk.raw disk.map",
        ),
        (
            "Hash an export in 4 parts (on 4 hosts, or at once here), then merge them:",
            "for k in 1 2 3 4; do blkmap --range $k/4 nbd://server/disk part$k & done; wait; blkmap merge disk.map part*",
        ),
        (
            "Each night, the map and checksum of a qcow2 image from its dirty bitmap, reading only what changed:",
            "blkmap --base disk.map --dirty-bitmap nightly disk.qcow2 disk.map && qemu-img bitmap --clear disk.qcow2 nightly",
        ),
        (
            "The checksum a map holds, as blksum prints it:",
            "blkmap checksum --name disk.qcow2 disk.map",
        ),
        (
            "A Proxmox Backup Server index's index_csum, checked, to compare with a restored disk:",
            "blkmap checksum --construction pbs drive-scsi0.img.fidx; blksum --construction pbs disk.raw",
        ),
    ],
};

fn main() -> ExitCode {
    blkhash::one_heap_under_a_limit();
    if let Some(code) = blkcli::manual::early::<Args>(&PAGE) {
        return code;
    }
    let args: Args = blkcli::args::parse_map_args(command(), |a: &Args| &a.input);
    match &args.command {
        Some(Command::Merge { out, parts, line }) => merge(out, parts, line),
        Some(Command::Checksum { maps, line }) => checksum(maps, line),
        Some(Command::Bitmaps { image, json, input }) => {
            let mut cmd = command();
            cmd.build();
            let sub = cmd.find_subcommand_mut("bitmaps").expect("the subcommand");
            input.refuse_hashing(sub, "listing bitmaps");
            bitmaps(image, *json, input)
        }
        None => map(&args),
    }
}

/// The command, with `-h` a summary, and `bitmaps` taking only the options
/// that open an image.
fn command() -> clap::Command {
    use blkcli::help::*;
    let shown = [
        (
            "range",
            "Hash only RANGE (OFFSET+LENGTH or K/N) into a part",
        ),
        ("base", "Update OLD, the map when the bitmap began"),
        ("dirty_bitmap", "The dirty bitmap that marks what changed"),
        ("verify", "With --base: read the clean blocks too, to check"),
        ("json", "One JSON object instead of the checksum line"),
        CONSTRUCTION,
        DIGEST,
        BLOCK_SIZE,
        FORMAT,
        NO_BACKING,
        FORCE_SHARE,
        CACHE,
        PROGRESS,
    ];
    let listing = [
        ("json", "One JSON array instead of lines"),
        FORMAT,
        FORCE_SHARE,
        TIMEOUT,
    ];
    summarize(<Args as clap::CommandFactory>::command(), &shown)
        .mut_subcommand("merge", |c| {
            short_about(c, "Merge parts into the map OUT; print the checksum")
        })
        .mut_subcommand("checksum", |c| {
            short_about(c, "Print the checksum of a map, or of its parts")
        })
        .mut_subcommand("bitmaps", |c| {
            let c = short_about(c, "List the dirty bitmaps of IMAGE");
            summarize(blkcli::args::only_open_options(c), &listing)
        })
}

/// `blkmap IMAGE OUT [--range R]`.
fn map(args: &Args) -> ExitCode {
    let (Some(image_os), Some(out_path)) = (&args.image, &args.out) else {
        unreachable!("clap requires IMAGE and OUT without a subcommand")
    };
    let image = blkcli::shown_lossy(image_os);
    let input = blkcli::guard::Input {
        name: image_os,
        role: "the image",
    };
    if let Err(code) = check_out(out_path, &[input]) {
        return code;
    }
    let signals = Signals::install(&format!("blkmap: {image}: interrupted"));
    let progress = match Progress::new("blkmap", args.show.progress.progress, Some(1)) {
        Ok(p) => p,
        Err(msg) => {
            blkcli::say!("blkmap: {msg}");
            return ExitCode::from(2);
        }
    };
    // The map-writing functions check OUT again as they write, and write
    // it as the map is made: memory does not grow with the map.
    let inputs = [input];
    let out = blkjob::Out {
        path: out_path,
        inputs: &inputs,
    };
    let made = match (&args.base, &args.dirty_bitmap) {
        (Some(base), Some(bitmap)) => update(args, base, bitmap, &signals, &progress, out),
        _ => {
            let job = InputArgs::resolve(keyed_spec(&args.input), None)
                .with_cancel(signals.cancel.clone());
            make(args, &job, &progress, out).map_err(|e| said(&e, out, None))
        }
    };
    match made {
        Ok(Some((header, read))) => print_result(args, &header, read),
        // A part has no checksum of its own.
        Ok(None) => ExitCode::SUCCESS,
        Err(_) if signals.cancelled() => {
            blkcli::say!("blkmap: {image}: interrupted");
            ExitCode::from(signals.exit_status())
        }
        Err((name, msg)) => {
            blkcli::say!("blkmap: {}: {msg}", name.as_deref().unwrap_or(&image));
            ExitCode::FAILURE
        }
    }
}

/// What a run made: the map's header and what was read (`None`: a part,
/// with --range), or the error with the input it is about (`None`: IMAGE).
type Made = Result<Option<(blkmap::Header, Read)>, (Option<String>, String)>;

/// Before anything is read: OUT must not replace what it would destroy
/// (an input, a file that is not a map). `Err`: said, and the exit code.
fn check_out(out: &Path, inputs: &[blkcli::guard::Input]) -> Result<(), ExitCode> {
    let guard_out = blkcli::guard::Output {
        path: out,
        what: "a block map",
        own_kind: Some(blkmap::is_map),
    };
    blkcli::guard::check_outputs(&[guard_out], inputs).map_err(|e| {
        blkcli::say!("blkmap: {e}");
        ExitCode::FAILURE
    })
}

/// An error as it is said: of OUT if it is OUT's own (refused, not
/// created or renamed), else of the image, with `hint` added.
fn said(e: &io::Error, out: blkjob::Out<'_>, hint: Option<&str>) -> (Option<String>, String) {
    match e
        .get_ref()
        .and_then(|i| i.downcast_ref::<blkmap::OutputError>())
    {
        Some(o) => (Some(out.path.display().to_string()), reason(&o.0)),
        None => (None, reason(e) + hint.unwrap_or("")),
    }
}

/// The map of IMAGE (standard input if "-"), or with --range its part,
/// hashed whole and written to OUT as it is made.
fn make(
    args: &Args,
    job: &Job,
    progress: &Progress,
    out: blkjob::Out<'_>,
) -> io::Result<Option<(blkmap::Header, Read)>> {
    let image_os = args.image.as_deref().expect("clap requires IMAGE");
    if let Some(span) = args.range {
        return map_part(image_os, span, job, progress, out).map(|()| None);
    }
    let image = blkcli::shown_lossy(image_os);
    let m = job.open(image_os).and_then(|input| {
        progress.track(&image, input.size(), |p| {
            blkjob::map_image_to(image_os, input, job, job.cancel(), p, out)
        })
    })?;
    say_rounded(&image, m.rounded);
    say_decompressed(&image, m.decompressed.as_ref());
    let read = Read {
        dirty_blocks: m.summary.header.blocks(),
        sampled: 0,
        conflicting: 0,
        bytes: m.stats.data,
        checks: Vec::new(),
    };
    Ok(Some((m.summary.header, read)))
}

/// `blkmap --base OLD --dirty-bitmap NAME IMAGE OUT`: the map of IMAGE
/// now, written to OUT as it is made.
fn update(
    args: &Args,
    base_path: &Path,
    bitmap: &str,
    signals: &Signals,
    progress: &Progress,
    out: blkjob::Out<'_>,
) -> Made {
    let image_os = args.image.as_deref().expect("clap requires IMAGE");
    let image = blkcli::shown_lossy(image_os);
    let base_name = base_path.display().to_string();
    // Read where it lies: its blocks once in order, a few by index.
    let old =
        blkmap::MapFile::open(base_path).map_err(|e| (Some(base_name.clone()), e.to_string()))?;
    let (algorithm, block_size) = (old.header().algorithm, old.header().block_size);
    let job = InputArgs::resolve(keyed_spec(&args.input), Some((algorithm, block_size)))
        .with_cancel(signals.cancel.clone());
    let failed = |e: io::Error| {
        let hint = blkimage::cause::<blkjob::incremental::ReadWhole>(&e).map(|w| {
            if w.verify_helps() {
                " (a full map: blkmap IMAGE OUT, without --base; or --verify: every block read)"
            } else {
                " (a full map: blkmap IMAGE OUT, without --base)"
            }
        });
        said(&e, out, hint)
    };
    let src = job
        .open_dirty(image_os, bitmap, "--dirty-bitmap")
        .map_err(failed)?;
    let base = blkjob::incremental::Base {
        map: &old,
        name: &base_name,
    };
    // --verify reads the image a second time.
    let size = Some(src.size() * (1 + u64::from(args.verify)));
    let updated = progress
        .track(&image, size, |p| {
            blkmap::save_with(out.path, out.inputs, |mut file| {
                let verify = args.verify;
                blkjob::incremental::update_map(
                    src, image_os, &base, bitmap, verify, &job, p, &mut file,
                )
            })
        })
        .map_err(failed)?;
    let read = Read {
        dirty_blocks: updated.changes.dirty_blocks(),
        sampled: updated.sampled,
        conflicting: updated.conflicting,
        bytes: updated.read_bytes,
        checks: updated.changes.checks.iter().map(|c| c.name()).collect(),
    };
    Ok(Some((updated.header, read)))
}

/// What a run read, for --json.
struct Read {
    /// Blocks hashed (every block, for a full run).
    dirty_blocks: u64,
    /// Clean blocks read again to check OLD.
    sampled: u64,
    /// Clean blocks read because their allocation contradicts OLD.
    conflicting: u64,
    /// Bytes read from the image.
    bytes: u64,
    /// The checks an update made (none for a full run).
    checks: Vec<&'static str>,
}

/// The version of `--json`'s document: it changes only when a key changes
/// meaning or goes away (new keys may be added), as blksum's and blkdiff's.
const JSON_SCHEMA: u32 = 1;

/// The checksum line, or with --json the object describing the run.
fn print_result(args: &Args, map: &blkmap::Header, read: Read) -> ExitCode {
    let image = args.image.as_deref().expect("clap requires IMAGE");
    let construction = args.input.construction.unwrap_or_default();
    let out = args.out.as_deref().expect("clap requires OUT");
    let checksum = match checksum_in(out, map, construction) {
        Ok(sum) => sum,
        Err(e) => {
            blkcli::say!("blkmap: {}: {}", out.display(), reason(&e));
            return ExitCode::FAILURE;
        }
    };
    if !args.json {
        let params = (construction, map.algorithm, map.block_size);
        return print_line(&checksum, &blkcli::shown(image), params, false);
    }
    // Spelled as blksum's and blkdiff's JSON (qemu-img's `virtual-size`);
    // `size`, this document's first name for it, is kept while `schema`
    // is 1.
    let mut doc = serde_json::json!({
        "schema": JSON_SCHEMA,
        "image": blkcli::shown_lossy(image),
        "checksum": checksum,
        "construction": construction.name(),
        "digest": map.algorithm.to_string(),
        "block-size": map.block_size,
        "virtual-size": map.size,
        "size": map.size,
        "blocks": map.blocks(),
        "dirty-blocks": read.dirty_blocks,
        "sampled-blocks": read.sampled,
        "conflicting-blocks": read.conflicting,
        "read-bytes": read.bytes,
        "checks": read.checks,
    });
    if let Some(escaped) = blkcli::lines::json_escaped(image) {
        doc["image-escaped"] = escaped.into();
    }
    output::code(Stdout::new("blkmap").json(&doc))
}

/// The checksum of the map just written to `out` (its header `map`) in
/// `construction`: the header's for blkhash 0.11's, else derived from the
/// digests, read again from the file (a map holds blkhash 0.11's).
fn checksum_in(
    out: &Path,
    map: &blkmap::Header,
    construction: blkhash::Construction,
) -> io::Result<String> {
    let sum = match construction {
        blkhash::Construction::Blkhash => map.checksum.clone(),
        c => {
            let file = io::BufReader::with_capacity(1 << 20, std::fs::File::open(out)?);
            blkmap::checksum_in(blkmap::MapReader::new(file)?, c)?
        }
    };
    Ok(sum.map(|c| c.to_hex()).unwrap_or_default())
}

/// The job of a map: with `--keyfile`, its block digests keyed as an
/// encrypted backup's index holds them, so that the map compares with one.
fn keyed_spec(input: &InputArgs) -> blkjob::JobSpec {
    let mut spec = input.spec();
    spec.keyed = spec.open.keyfile.is_some();
    spec
}

/// `blkmap bitmaps IMAGE`.
fn bitmaps(image: &OsStr, json: bool, input: &InputArgs) -> ExitCode {
    let mut spec = input.spec();
    spec.open.nbd.list_bitmaps = true;
    let job = InputArgs::resolve(spec, None);
    let name = blkcli::shown_lossy(image);
    let listed = job
        .open(image)
        .and_then(|i| blkjob::seekable(i, "listing bitmaps"))
        .and_then(|src| src.bitmaps());
    let list = match listed {
        Ok(l) => l,
        Err(e) => {
            blkcli::say!("blkmap: {name}: {}", reason(&e));
            return ExitCode::FAILURE;
        }
    };
    if json {
        let items: Vec<_> = (list.iter())
            .map(|b| {
                serde_json::json!({
                    "name": b.name,
                    "granularity": b.granularity,
                    "in-use": b.in_use,
                    "enabled": b.enabled,
                })
            })
            .collect();
        let doc = serde_json::Value::Array(items);
        return output::code(Stdout::new("blkmap").json(&doc));
    }
    // Names as checksum lines escape them: a name of control bytes
    // (a NUL, a newline) must not forge lines.
    let names: Vec<String> = (list.iter())
        .map(|b| blkcli::lines::escape_name(b.name.as_bytes()))
        .collect();
    let width = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0)
        .max(4);
    let mut text = format!("{:width$}  {:>11}  FLAGS\n", "NAME", "GRANULARITY");
    for (b, name) in list.iter().zip(&names) {
        let gran = b.granularity.map_or("-".to_string(), |g| g.to_string());
        let mut flags = Vec::new();
        match b.enabled {
            Some(true) => flags.push("enabled"),
            Some(false) => flags.push("disabled"),
            None => {}
        }
        if b.in_use == Some(true) {
            flags.push("in-use");
        }
        let flags = if flags.is_empty() {
            "-".to_string()
        } else {
            flags.join(",")
        };
        text += &format!("{name:width$}  {gran:>11}  {flags}\n");
    }
    output::print_code("blkmap", |out| out.write_all(text.as_bytes()))
}

/// Hash the bytes `span` of the image `name` into a part.
fn map_part(
    name: &OsStr,
    span: Span,
    job: &Job,
    progress: &Progress,
    out: blkjob::Out<'_>,
) -> io::Result<()> {
    let input = job.open(name)?;
    // Asked of the image, not of the range's window over it.
    let rounded = input.rounded();
    let decompressed = input.decompressed();
    let src = blkjob::seekable(input, "--range")?;
    let (offset, len) = span
        .resolve(src.size(), job.block_size())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let range = blkmap::Range { offset, len };
    let shown = blkcli::shown_lossy(name);
    progress.track(&shown, Some(len), |p| {
        blkjob::map_range_to(name, src, range, job, p, out)
    })?;
    say_rounded(&shown, rounded);
    say_decompressed(&shown, decompressed.as_ref());
    Ok(())
}

/// A compressed image decompressed into a temporary file: said once.
fn say_decompressed(image: &str, decompressed: Option<&blkimage::Decompressed>) {
    if let Some(d) = decompressed {
        blkcli::say!("blkmap: {image}: {d}");
    }
}

/// A raw file hashed at QEMU's size, not its own: said once.
fn say_rounded(image: &str, rounded: Option<blkimage::Rounded>) {
    if let Some(r) = rounded {
        blkcli::say!("blkmap: {image}: {r}");
    }
}

/// `blkmap merge OUT PART...`.
fn merge(out: &Path, parts: &[PathBuf], line: &LineArgs) -> ExitCode {
    let inputs: Vec<_> = parts
        .iter()
        .map(|p| blkcli::guard::Input {
            name: p.as_os_str(),
            role: "a part",
        })
        .collect();
    if let Err(code) = check_out(out, &inputs) {
        return code;
    }
    // Stopped by Ctrl-C or SIGTERM between batches of zero digests (a part
    // may claim a huge image of zeros): OUT is left as it was, and the
    // temporary file removed.
    let signals = Signals::install(&format!("blkmap: {}: interrupted", out.display()));
    match blkmap::merge_files_until(parts, Some(out), &signals.cancel) {
        Err(_) if signals.cancelled() => {
            blkcli::say!("blkmap: {}: interrupted", out.display());
            ExitCode::from(signals.exit_status())
        }
        Ok(h) => {
            let hex = h
                .checksum
                .as_ref()
                .map(blkhash::Checksum::to_hex)
                .unwrap_or_default();
            let name = line.name.as_deref().unwrap_or(out.as_os_str());
            let params = (blkhash::Construction::Blkhash, h.algorithm, h.block_size);
            print_line(&hex, name, params, line.tag)
        }
        Err(e) => {
            say_merge_error(&out.display().to_string(), e);
            ExitCode::FAILURE
        }
    }
}

/// `blkmap checksum MAP...`.
fn checksum(maps: &[PathBuf], line: &LineArgs) -> ExitCode {
    // The line is named as blksum names an image: one map by its own name;
    // several parts make no one file, so the caller names them.
    let name = match (&line.name, maps) {
        (Some(name), _) => name.clone(),
        (None, [map]) => map.clone().into_os_string(),
        (None, _) => {
            let mut cmd = command();
            cmd.build();
            let sub = cmd.find_subcommand_mut("checksum").expect("the subcommand");
            sub.error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "the checksum of several parts needs --name NAME for its line (the image's \
                 name, as blksum prints it): the parts are not one file to name it after",
            )
            .exit();
        }
    };
    let c = line.construction.unwrap_or_default();
    if let [path] = maps
        && blkmap::is_fidx_file(path)
    {
        // An index's own checksum is its index_csum, what PBS shows: a
        // blkhash checksum of it would match nothing a PBS user has.
        let c = line.construction.unwrap_or(blkhash::Construction::Pbs);
        let sum = blkmap::open_fidx(path).and_then(|mut r| {
            let sum = r.checksum_in(c)?;
            Ok((sum, r.header().chunk_size))
        });
        return match sum {
            Ok((sum, bs)) => print_line(&sum.to_hex(), &name, (c, sum.algorithm(), bs), line.tag),
            Err(e) => {
                say_merge_error(&path.display().to_string(), e.into());
                ExitCode::FAILURE
            }
        };
    }
    let never = std::sync::atomic::AtomicBool::new(false);
    match blkmap::checksum_files_until(maps, c, &never) {
        Ok(h) => {
            let hex = h
                .checksum
                .as_ref()
                .map(blkhash::Checksum::to_hex)
                .unwrap_or_default();
            print_line(&hex, &name, (c, h.algorithm, h.block_size), line.tag)
        }
        Err(e) => {
            let parts: Vec<_> = maps.iter().map(|p| p.display().to_string()).collect();
            say_merge_error(&parts.join(" "), e);
            ExitCode::FAILURE
        }
    }
}

/// A merge's error as every other error is said, `blkmap: FILE: reason`:
/// FILE is the part at fault (damaged, missing, not a map), else
/// `subject` (the map OUT that is not written, or the parts checked) when
/// the parts do not make a map together (a gap, an overlap, a mismatch:
/// the reason names them).
fn say_merge_error(subject: &str, e: blkmap::MapError) {
    let said = |e: &blkmap::MapError| match e {
        blkmap::MapError::Io(e) => reason(e),
        e => e.to_string(),
    };
    match e {
        blkmap::MapError::In(part, e) => blkcli::say!("blkmap: {part}: {}", said(&e)),
        e => blkcli::say!("blkmap: {subject}: {}", said(&e)),
    }
}

/// Print a checksum line as blksum does (with `tag`, as `--tag`).
fn print_line(
    hex: &str,
    name: &OsStr,
    params: (blkhash::Construction, blkhash::Algorithm, usize),
    tag: bool,
) -> ExitCode {
    let style = LineStyle { tag, zero: false };
    output::code(Stdout::new("blkmap").checksum(style, hex, name, params))
}
