//! Hashing one input: open it, wire its source to a hasher, report.

use blkcli::progress::Progress;
use blkhash::{Algorithm, Checksum, Options, Pipeline};
use blkimage::{AlignedBuf, OpenOptions, Stats};
use blktools::checkpoint::Checkpoint;
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
    /// Bytes a checkpoint covered when the run started.
    pub resumed_at: u64,
    /// The file's size, if the guest size was rounded up from it (a raw
    /// file whose length is not a multiple of 512): said on standard error.
    pub rounded: Option<blkimage::Rounded>,
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
    /// Resume from and save to a checkpoint (one input).
    pub checkpoint: Option<Checkpoint>,
}

impl Hashing {
    /// The checksum of `name` with `alg` and `block_size`.
    pub fn checksum(&self, name: &OsStr, alg: Algorithm, block_size: usize) -> io::Result<Report> {
        let shown = name.to_string_lossy();
        let input = blkimage::open(name, &self.open)?;
        let rounded = input.rounded();
        if let Some(ck) = &self.checkpoint {
            let mut report = self.resumable(name, input, alg, block_size, ck)?;
            report.rounded = rounded;
            return Ok(report);
        }
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
        shown_progress.finish();
        Ok(Report {
            format: read.format,
            size: read.stats.total(),
            block_size,
            checksum,
            stats: read.stats,
            resumed_at: 0,
            rounded,
        })
    }

    /// The checksum of `input`, resuming from and saving to `ck`.
    fn resumable(
        &self,
        name: &OsStr,
        input: blkimage::Input,
        alg: Algorithm,
        block_size: usize,
        ck: &Checkpoint,
    ) -> io::Result<Report> {
        let opts = blktools::MapOptions {
            algorithm: alg,
            block_size,
            threads: self.threads,
            read_size: self.read_size,
            queue_depth: self.queue_depth,
            io_depth: self.io_depth,
            open: self.open.clone(),
            cancel: self.cancel.clone(),
            progress: None,
        };
        let mut shown = self.progress.start(&name.to_string_lossy(), input.size());
        let r = blktools::checkpoint::hash(name, input, &opts, ck, &mut |n| shown.inc(n))?;
        shown.finish();
        Ok(Report {
            format: r.format,
            size: r.size,
            block_size,
            checksum: Checksum::from_hex(alg, &blkhash::to_hex(&r.checksum))
                .map_err(io::Error::other)?,
            stats: r.stats,
            resumed_at: r.resumed_at,
            rounded: None,
        })
    }
}
