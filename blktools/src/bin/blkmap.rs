//! blkmap: write the block map of an image, and print its checksum.

use blkcli::lines::format_line_os;
use blkcli::manual::Page;
use blkcli::signals::Signals;
use blktools::{InputArgs, reason};
use clap::Parser;
use std::ffi::OsString;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Write the block map of IMAGE to OUT and print the image's blkhash
/// checksum, as blksum does.
///
/// The map holds the digest, block size, virtual size and checksum of the
/// image, and per block its digest or a zero-block marker (runs stored as
/// runs): about 0.05% of the image for data (sha256, 64k blocks), next to
/// nothing for sparse ranges. `blkdiff` compares maps and images. OUT is
/// written atomically: a temporary file in its directory, flushed, renamed.
#[derive(Parser, Debug)]
#[command(name = "blkmap", version, max_term_width = 100)]
struct Args {
    /// The image: any input blksum reads ('-' for standard input).
    #[arg(value_name = "IMAGE")]
    image: OsString,

    /// Where to write the map.
    #[arg(value_name = "OUT")]
    out: PathBuf,

    #[command(flatten)]
    input: InputArgs,

    #[command(flatten)]
    show: blkcli::progress::ShowArgs,
}

const PAGE: Page = Page {
    exit_status: &[
        ("0", "The map was written and the checksum printed."),
        (
            "1",
            "The image could not be read, or OUT could not be written (or would replace an input or a file that is not a map); OUT is left as it was.",
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
    ],
};

fn main() -> ExitCode {
    if let Some(code) = blkcli::manual::early::<Args>(&PAGE) {
        return code;
    }
    let args: Args = blktools::parse_args(|a: &Args| &a.input);
    let (image, out_name) = (args.image.to_string_lossy(), args.out.display());
    // Before anything is read: OUT must not replace what it would destroy.
    let out = blkcli::guard::Output {
        path: &args.out,
        what: "a block map",
        own_kind: Some(blkmap::is_map),
    };
    let input = blkcli::guard::Input {
        name: &args.image,
        role: "the image",
    };
    if let Err(e) = blkcli::guard::check_outputs(&[out], &[input]) {
        eprintln!("blkmap: {e}");
        return ExitCode::FAILURE;
    }
    let (algorithm, block_size) = blktools::map_params(&args.input, None);
    let mut opts = blktools::map_options(&args.input, algorithm, block_size);
    let signals = Signals::install(&format!("blkmap: {image}: interrupted"));
    opts.cancel = signals.cancel.clone();
    match blkcli::progress::Progress::new("blkmap", args.show.progress.progress, Some(1)) {
        Ok(p) => opts.progress = Some(std::sync::Arc::new(p)),
        Err(msg) => {
            eprintln!("blkmap: {msg}");
            return ExitCode::from(2);
        }
    }
    let mapped = if args.image == "-" {
        blktools::map_stdin(&opts, false)
    } else {
        blktools::map_image(&args.image, &opts)
    };
    let map = match mapped {
        Ok(m) => m.map,
        Err(_) if signals.cancelled() => {
            eprintln!("blkmap: {image}: interrupted");
            return ExitCode::from(signals.exit_status());
        }
        Err(e) => {
            eprintln!("blkmap: {image}: {}", reason(&e));
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = map.save(&args.out) {
        eprintln!("blkmap: {out_name}: {}", reason(&e));
        return ExitCode::FAILURE;
    }
    let mut line = format_line_os(&map.checksum_hex(), &args.image, None);
    line.push(b'\n');
    let mut out = io::stdout().lock();
    match out.write_all(&line).and_then(|_| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}
