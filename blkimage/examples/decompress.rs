//! Decompress a gzip, xz or zstd file into nothing with the decoder blksum
//! reads compressed images through ([`blkimage::compressed::Decoder`], in
//! reads of blksum's 1 MiB): the decompressor's own time on a file, which
//! `blksum FILE` should come close to when the digests hide behind it
//! (bench/run.py's `decompress` case).
//!
//!     cargo run --release -p blkhash-image --example decompress -- FILE [XZ-THREADS]
//!
//! XZ-THREADS: the threads xz decodes on (default: one per core, as blksum).
//! Prints the decompressed bytes on standard error.

use blkimage::compressed::{self, Compression, Decoder};
use std::io::{self, Read};

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(path), threads) = (args.next(), args.next()) else {
        eprintln!("usage: decompress FILE [XZ-THREADS]");
        std::process::exit(2);
    };
    let threads = match threads.map(|t| t.parse::<u32>()) {
        None => compressed::default_threads(),
        Some(Ok(t)) if t > 0 => t,
        Some(_) => {
            eprintln!("decompress: XZ-THREADS: a number above 0");
            std::process::exit(2);
        }
    };
    match run(&path, threads) {
        Ok(n) => eprintln!("{n} bytes"),
        Err(e) => {
            eprintln!("decompress: {path}: {e}");
            std::process::exit(1);
        }
    }
}

/// Decompress `path` on `threads`; the bytes it held.
fn run(path: &str, threads: u32) -> io::Result<u64> {
    let mut file = std::fs::File::open(path)?;
    let head = compressed::read_head(&mut file, compressed::PROBE_LEN)?;
    let kind = Compression::probe(&head)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not gzip, xz or zstd"))?;
    let input =
        io::BufReader::with_capacity(compressed::INPUT_BUFFER, io::Cursor::new(head).chain(file));
    let mut d = Decoder::new(kind, input, threads)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        match d.read(&mut buf)? {
            0 => return Ok(total),
            n => total += n as u64,
        }
    }
}
