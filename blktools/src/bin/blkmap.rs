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
            "The image could not be read, the parts do not make a map (a gap, an overlap, a mismatch, damage), or OUT could not be written (or would replace an input or a file that is not a map); OUT is left as it was.",
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
        None => map(&args),
    }
}

/// `blkmap IMAGE OUT [--range R]`.
fn map(args: &Args) -> ExitCode {
    let (Some(image_os), Some(out_path)) = (&args.image, &args.out) else {
        unreachable!("clap requires IMAGE and OUT without a subcommand")
    };
    let (image, out_name) = (image_os.to_string_lossy(), out_path.display());
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
                (m.map.save_guarded(out_path, &inputs), Some(m.map))
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
        Some(map) => print_line(&map.checksum().to_hex(), image_os, None),
        // A part has no checksum of its own.
        None => ExitCode::SUCCESS,
    }
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
    let shown = name.to_string_lossy();
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
