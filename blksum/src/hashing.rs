//! Hashing one input: open it, wire its source to a hasher, report.

use blkcli::progress::Progress;
use blkhash::{Algorithm, Checksum, Options, Pipeline};
use blkimage::{AlignedBuf, OpenOptions, Stats};
use std::ffi::OsStr;
use std::io;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// What hashing one input found.
#[derive(Debug)]
pub struct Report {
    /// "raw", "qcow2", or "stream" for a pipe.
    pub format: String,
    /// Guest-visible bytes hashed.
    pub size: u64,
    pub block_size: usize,
    pub checksum: Checksum,
    pub stats: Stats,
}

/// Everything needed to hash inputs, shared by all of them.
pub struct Hashing {
    pub open: OpenOptions,
    pub threads: usize,
    pub queue_depth: usize,
    /// Reads in flight apart from the digest threads (None: the reader's default).
    pub io_depth: Option<usize>,
    /// Bytes per read, before rounding up to whole blocks.
    pub read_size: usize,
    pub cancel: Arc<AtomicBool>,
    pub progress: Progress,
}

impl Hashing {
    /// The checksum of `name` with `alg` and `block_size`.
    pub fn checksum(&self, name: &OsStr, alg: Algorithm, block_size: usize) -> io::Result<Report> {
        let shown = name.to_string_lossy();
        let input = blkimage::open(name, &self.open)?;
        let opts = Options::new()
            .algorithm(alg)
            .block_size(block_size)
            .threads(self.threads)
            .queue_depth(self.queue_depth);
        let mut sink: Pipeline<AlignedBuf> = Pipeline::new(opts).map_err(io::Error::other)?;
        // Whole blocks per read: reads then go to the digest workers as they are.
        let read_size = self.read_size.next_multiple_of(block_size);
        let mut shown_progress = self.progress.start(&shown, input.size());
        let read = blkimage::read_input(
            input,
            &mut sink,
            read_size,
            self.io_depth,
            &self.cancel,
            &mut |n| shown_progress.inc(n),
        )?;
        let checksum = sink.finalize()?;
        // Only now are all reads done: is the image still what we read?
        read.finish()?;
        Ok(Report {
            format: read.format,
            size: read.stats.total(),
            block_size,
            checksum,
            stats: read.stats,
        })
    }
}
