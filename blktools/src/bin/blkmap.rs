//! blkmap: write the block map of an image (or of a range of it, a part),
//! merge parts, and print a map's checksum.

use blkcli::args::InputArgs;
use blkcli::lines::format_line_os;
use blkcli::manual::Page;
use blkcli::progress::Progress;
use blkcli::signals::Signals;
use blkcli::units::{Span, parse_span, reason};
use blkjob::Job;
use clap::{Parser, Subcommand};
use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
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
    /// is checked first: same size, digest and block size, 16 clean blocks
    /// read again must hold what OLD says, no backing file written since
    /// OLD was saved; a bitmap QEMU marks in use (inconsistent) or
    /// disabled is refused.
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

    /// Print one JSON object (image, checksum, digest, block-size, size,
    /// blocks, dirty-blocks, sampled-blocks, read-bytes) instead of the
    /// checksum line.
    #[arg(long, conflicts_with = "range")]
    json: bool,

    #[command(flatten)]
    input: InputArgs,

    #[command(flatten)]
    show: blkcli::progress::ShowArgs,
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
    /// blksum's output or to check with blksum -c); default: the map's.
    #[arg(long, value_name = "NAME")]
    name: Option<OsString>,
    /// Write a BSD-style line naming the digest and block size, as blksum
    /// --tag.
    #[arg(long)]
    tag: bool,
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
    ],
};

fn main() -> ExitCode {
    if let Some(code) = blkcli::manual::early::<Args>(&PAGE) {
        return code;
    }
    let args: Args = blkcli::args::parse_map_args(|a: &Args| &a.input);
    match &args.command {
        Some(Command::Merge { out, parts, line }) => merge(out, parts, line),
        Some(Command::Checksum { maps, line }) => checksum(maps, line),
        Some(Command::Bitmaps { image, json, input }) => bitmaps(image, *json, input),
        None => map(&args),
    }
}

/// `blkmap IMAGE OUT [--range R]`.
fn map(args: &Args) -> ExitCode {
    let (Some(image_os), Some(out_path)) = (&args.image, &args.out) else {
        unreachable!("clap requires IMAGE and OUT without a subcommand")
    };
    let (image, out_name) = (blkcli::shown_lossy(image_os), out_path.display());
    // Before anything is read: OUT must not replace what it would destroy.
    let out = blkcli::guard::Output {
        path: out_path,
        what: "a block map",
        own_kind: Some(blkmap::is_map),
    };
    let input = blkcli::guard::Input {
        name: image_os,
        role: "the image",
    };
    if let Err(e) = blkcli::guard::check_outputs(&[out], &[input]) {
        eprintln!("blkmap: {e}");
        return ExitCode::FAILURE;
    }
    let signals = Signals::install(&format!("blkmap: {image}: interrupted"));
    let job = args.input.job(None).with_cancel(signals.cancel.clone());
    let progress = match Progress::new("blkmap", args.show.progress.progress, Some(1)) {
        Ok(p) => p,
        Err(msg) => {
            eprintln!("blkmap: {msg}");
            return ExitCode::from(2);
        }
    };
    // The map-writing functions check OUT again as they write.
    let inputs = [input];
    if let (Some(base), Some(bitmap)) = (&args.base, &args.dirty_bitmap) {
        let done = update(args, base, bitmap, &signals, &progress);
        return match done {
            Ok((map, read)) => match map.save_guarded(out_path, &inputs) {
                Ok(()) => print_result(args, &map, read),
                Err(e) => {
                    eprintln!("blkmap: {out_name}: {}", reason(&e));
                    ExitCode::FAILURE
                }
            },
            Err(_) if signals.cancelled() => {
                eprintln!("blkmap: {image}: interrupted");
                ExitCode::from(signals.exit_status())
            }
            Err((None, msg)) => {
                eprintln!("blkmap: {image}: {msg}");
                ExitCode::FAILURE
            }
            Err((Some(name), msg)) => {
                eprintln!("blkmap: {name}: {msg}");
                ExitCode::FAILURE
            }
        };
    }
    let saved = match args.range {
        Some(span) => map_part(image_os, span, &job, &progress)
            .map(|part| (part.save_guarded(out_path, &inputs), None)),
        None => {
            let mapped = if image_os == "-" {
                progress.track("-", None, |p| blkjob::map_stdin(&job, false, p))
            } else {
                job.open(image_os).and_then(|input| {
                    progress.track(&image, input.size(), |p| {
                        blkjob::map(input, &job, job.cancel(), p)
                    })
                })
            };
            mapped.map(|m| {
                say_rounded(&image, m.rounded);
                let read = Read {
                    dirty_blocks: m.map.blocks(),
                    sampled: 0,
                    bytes: m.stats.data,
                };
                (m.map.save_guarded(out_path, &inputs), Some((m.map, read)))
            })
        }
    };
    let map = match saved {
        Ok((Ok(()), map)) => map,
        Ok((Err(e), _)) => {
            eprintln!("blkmap: {out_name}: {}", reason(&e));
            return ExitCode::FAILURE;
        }
        Err(_) if signals.cancelled() => {
            eprintln!("blkmap: {image}: interrupted");
            return ExitCode::from(signals.exit_status());
        }
        Err(e) => {
            eprintln!("blkmap: {image}: {}", reason(&e));
            return ExitCode::FAILURE;
        }
    };
    match map {
        Some((map, read)) => print_result(args, &map, read),
        // A part has no checksum of its own.
        None => ExitCode::SUCCESS,
    }
}

/// `blkmap --base OLD --dirty-bitmap NAME IMAGE OUT`: the map of IMAGE
/// now, or the error with the input it is about (`None`: IMAGE).
fn update(
    args: &Args,
    base_path: &Path,
    bitmap: &str,
    signals: &Signals,
    progress: &Progress,
) -> Result<(blkmap::Map, Read), (Option<String>, String)> {
    let image_os = args.image.as_deref().expect("clap requires IMAGE");
    let image = blkcli::shown_lossy(image_os);
    let base_name = base_path.display().to_string();
    let old = blkmap::Map::load(base_path).map_err(|e| (Some(base_name.clone()), e.to_string()))?;
    let mut spec = args.input.spec();
    // An NBD server offers a bitmap only if asked for it while connecting.
    spec.open.nbd.dirty_bitmap = Some(bitmap.to_string());
    let job = InputArgs::resolve(spec, Some((old.algorithm(), old.block_size())))
        .with_cancel(signals.cancel.clone());
    let failed = |e: io::Error| (None, reason(&e));
    let src = job
        .open(image_os)
        .and_then(|i| blkjob::seekable(i, "--dirty-bitmap"))
        .map_err(failed)?;
    let base = blkjob::incremental::Base::of_file(&old, base_path, &base_name);
    let size = Some(src.size());
    let updated = progress
        .track(&image, size, |p| {
            blkjob::incremental::update_map(src.clone(), &base, bitmap, &job, p)
        })
        .map_err(failed)?;
    let read = Read {
        dirty_blocks: updated.changes.dirty_blocks(),
        sampled: updated.sampled,
        bytes: updated.read_bytes,
    };
    if args.verify {
        progress
            .track(&image, size, |p| {
                blkjob::incremental::check_verified(src, &updated.map, &base, bitmap, &job, p)
            })
            .map_err(failed)?;
    }
    Ok((updated.map, read))
}

/// What a run read, for --json.
struct Read {
    /// Blocks hashed (every block, for a full run).
    dirty_blocks: u64,
    /// Clean blocks read again to check OLD.
    sampled: u64,
    /// Bytes read from the image.
    bytes: u64,
}

/// The checksum line, or with --json the object describing the run.
fn print_result(args: &Args, map: &blkmap::Map, read: Read) -> ExitCode {
    let image = args.image.as_deref().expect("clap requires IMAGE");
    if !args.json {
        return print_line(&map.checksum().to_hex(), &blkcli::shown(image), None);
    }
    let doc = serde_json::json!({
        "image": blkcli::shown_lossy(image),
        "checksum": map.checksum().to_hex(),
        "digest": map.algorithm().to_string(),
        "block-size": map.block_size(),
        "size": map.size(),
        "blocks": map.blocks(),
        "dirty-blocks": read.dirty_blocks,
        "sampled-blocks": read.sampled,
        "read-bytes": read.bytes,
    });
    println!("{doc:#}");
    ExitCode::SUCCESS
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
            eprintln!("blkmap: {name}: {}", reason(&e));
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
        println!("{:#}", serde_json::Value::Array(items));
        return ExitCode::SUCCESS;
    }
    let width = list.iter().map(|b| b.name.len()).max().unwrap_or(0).max(4);
    println!("{:width$}  {:>11}  FLAGS", "NAME", "GRANULARITY");
    for b in &list {
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
        println!("{:width$}  {gran:>11}  {flags}", b.name);
    }
    ExitCode::SUCCESS
}

/// Hash the bytes `span` of the image `name` into a part.
fn map_part(name: &OsStr, span: Span, job: &Job, progress: &Progress) -> io::Result<blkmap::Part> {
    let input = job.open(name)?;
    // Asked of the image, not of the range's window over it.
    let rounded = input.rounded();
    let src = blkjob::seekable(input, "--range")?;
    let (offset, len) = span
        .resolve(src.size(), job.block_size())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let range = blkmap::Range { offset, len };
    let shown = blkcli::shown_lossy(name);
    let part = progress.track(&shown, Some(len), |p| blkjob::map_range(src, range, job, p))?;
    say_rounded(&shown, rounded);
    Ok(part)
}

/// A raw file hashed at QEMU's size, not its own: said once.
fn say_rounded(image: &str, rounded: Option<blkimage::Rounded>) {
    if let Some(r) = rounded {
        eprintln!("blkmap: {image}: {r}");
    }
}

/// `blkmap merge OUT PART...`.
fn merge(out: &Path, parts: &[PathBuf], line: &LineArgs) -> ExitCode {
    let guard_out = blkcli::guard::Output {
        path: out,
        what: "a block map",
        own_kind: Some(blkmap::is_map),
    };
    let inputs: Vec<_> = parts
        .iter()
        .map(|p| blkcli::guard::Input {
            name: p.as_os_str(),
            role: "a part",
        })
        .collect();
    if let Err(e) = blkcli::guard::check_outputs(&[guard_out], &inputs) {
        eprintln!("blkmap: {e}");
        return ExitCode::FAILURE;
    }
    // Stopped by Ctrl-C or SIGTERM between batches of zero digests (a part
    // may claim a huge image of zeros): OUT is left as it was, and the
    // temporary file removed.
    let signals = Signals::install(&format!("blkmap: {}: interrupted", out.display()));
    match blkmap::merge_files_until(parts, Some(out), &signals.cancel) {
        Err(_) if signals.cancelled() => {
            eprintln!("blkmap: {}: interrupted", out.display());
            ExitCode::from(signals.exit_status())
        }
        Ok(h) => {
            let hex = h
                .checksum
                .as_ref()
                .map(blkhash::Checksum::to_hex)
                .unwrap_or_default();
            let name = line.name.as_deref().unwrap_or(out.as_os_str());
            print_line(&hex, name, line.tag.then_some((h.algorithm, h.block_size)))
        }
        Err(e) => {
            eprintln!("blkmap: {}: {e}", out.display());
            ExitCode::FAILURE
        }
    }
}

/// `blkmap checksum MAP...`.
fn checksum(maps: &[PathBuf], line: &LineArgs) -> ExitCode {
    match blkmap::merge_files(maps, None) {
        Ok(h) => {
            let hex = h
                .checksum
                .as_ref()
                .map(blkhash::Checksum::to_hex)
                .unwrap_or_default();
            let name = line.name.as_deref().unwrap_or(maps[0].as_os_str());
            print_line(&hex, name, line.tag.then_some((h.algorithm, h.block_size)))
        }
        Err(e) => {
            eprintln!("blkmap: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Print a checksum line as blksum does.
fn print_line(hex: &str, name: &OsStr, tag: Option<(blkhash::Algorithm, usize)>) -> ExitCode {
    let mut line = format_line_os(hex, name, tag);
    line.push(b'\n');
    let mut out = io::stdout().lock();
    match out.write_all(&line).and_then(|_| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}
