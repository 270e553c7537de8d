//! Hashing one input: open it, wire its source to a hasher, report.

use blkhash::{Algorithm, Checksum, Options, Pipeline};
use blkimage::{AlignedBuf, Input, OpenOptions, Source, Stats};
use indicatif::{ProgressBar, ProgressStyle};
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
        let progress = &self.progress;
        let report = |format: String, stats: Stats, checksum| Report {
            format,
            size: stats.total(),
            block_size,
            checksum,
            stats,
        };
        match input {
            Input::Image(src) => {
                let src: Arc<dyn Source> = Arc::from(src);
                progress.start(&shown, Some(src.size()));
                let stats = blkimage::read_image(
                    src.clone(),
                    &mut sink,
                    read_size,
                    &self.cancel,
                    &mut |n| progress.inc(n),
                )?;
                let checksum = sink.finalize()?;
                // Only now are all reads done: is the image still what we read?
                src.finish()?;
                Ok(report(src.format().to_string(), stats, checksum))
            }
            Input::Stream(mut r) => {
                progress.start(&shown, None);
                let stats =
                    blkimage::read_stream(&mut r, &mut sink, read_size, &self.cancel, &mut |n| {
                        progress.grow(n)
                    })?;
                let checksum = sink.finalize()?;
                Ok(report("stream".to_string(), stats, checksum))
            }
        }
    }
}

/// One progress display for the whole run, on standard error: bytes, rate
/// and time left. Its total grows as inputs are opened.
pub struct Progress(Option<ProgressBar>);

impl Progress {
    pub fn new(enabled: bool) -> Progress {
        if !enabled {
            return Progress(None);
        }
        let bar = ProgressBar::new(0).with_style(
            ProgressStyle::with_template(
                "{msg:20!} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        Progress(Some(bar))
    }

    fn start(&self, name: &str, size: Option<u64>) {
        if let Some(bar) = &self.0 {
            bar.set_message(name.to_string());
            bar.inc_length(size.unwrap_or(0));
        }
    }

    fn inc(&self, n: u64) {
        if let Some(bar) = &self.0 {
            bar.inc(n);
        }
    }

    /// Bytes of a stream, whose size was not known ahead.
    fn grow(&self, n: u64) {
        if let Some(bar) = &self.0 {
            bar.inc_length(n);
            bar.inc(n);
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}
