//! blkmap: write the block map of an image, and print its checksum.

use blktools::{InputArgs, checksum_line, reason};
use clap::Parser;
use std::io::{self, Write};
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
#[command(name = "blkmap", version, about, max_term_width = 100)]
struct Args {
    /// The image: any input blksum reads ('-' for standard input).
    #[arg(value_name = "IMAGE")]
    image: String,

    /// Where to write the map.
    #[arg(value_name = "OUT")]
    out: String,

    #[command(flatten)]
    input: InputArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (algorithm, block_size) = args.input.params(None);
    let opts = args.input.map_options(algorithm, block_size);
    let mapped = if args.image == "-" {
        blktools::map_stdin(&opts, false)
    } else {
        blktools::map_image(&args.image, &opts)
    };
    let map = match mapped {
        Ok(m) => m.map,
        Err(e) => {
            eprintln!("blkmap: {}: {}", args.image, reason(&e));
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = map.save(&args.out) {
        eprintln!("blkmap: {}: {}", args.out, reason(&e));
        return ExitCode::FAILURE;
    }
    let mut out = io::stdout().lock();
    match writeln!(out, "{}", checksum_line(&map.checksum_hex(), &args.image))
        .and_then(|_| out.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}
