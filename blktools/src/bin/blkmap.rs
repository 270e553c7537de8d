//! blkmap: write the block map of an image, and print its checksum.

use blkhash::{Algorithm, MAX_THREADS};
use blktools::{MapOptions, checksum_line, parse_block_size, parse_digest, parse_format, reason};
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

    /// Digest, by its OpenSSL name (not null).
    #[arg(short, long, value_name = "NAME", default_value = "sha256", value_parser = parse_digest)]
    digest: Algorithm,

    /// Block size: a multiple of 512 from 512 to 64m (suffixes k, m).
    #[arg(long, value_name = "SIZE", default_value = "64k", value_parser = parse_block_size)]
    block_size: usize,

    /// Digest threads [default: the number of cores].
    #[arg(short, long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=MAX_THREADS as i64))]
    threads: Option<u16>,

    /// Image format: raw or qcow2 [default: probed].
    #[arg(short, long, value_name = "FORMAT", value_parser = parse_format)]
    format: Option<blkimage::Format>,

    /// Refuse images that refer to other files (qcow2 backing and data files).
    #[arg(long)]
    no_backing: bool,

    /// Use the page cache (default: direct I/O where possible).
    #[arg(long)]
    cache: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let opts = MapOptions {
        algorithm: args.digest,
        block_size: args.block_size,
        threads: args
            .threads
            .map_or_else(blkhash::default_threads, usize::from),
        open: blkimage::OpenOptions {
            cache: args.cache,
            format: args.format,
            no_backing: args.no_backing,
            ..Default::default()
        },
        ..MapOptions::default()
    };
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
