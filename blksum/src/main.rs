//! blksum: wires inputs to the blkhash construction and prints checksums.

mod cli;
mod output;

use blkhash::{Checksum, Hasher, Options};
use blkimage::{AlignedBuf, Fill, Input, OpenOptions, Sink, Source};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The reader's sink: the hasher, taking buffers without copying them.
struct HashSink(Hasher<AlignedBuf>);

impl Sink for HashSink {
    fn read(&mut self, len: usize, fill: Fill) -> io::Result<()> {
        self.0.submit_with(len, fill)
    }
    fn data(&mut self, buf: AlignedBuf) -> io::Result<()> {
        self.0.submit(buf);
        Ok(())
    }
    fn zeros(&mut self, len: u64) -> io::Result<()> {
        self.0.update_zeros(len);
        Ok(())
    }
    fn reclaim(&mut self) -> Option<AlignedBuf> {
        self.0.reclaim()
    }
    fn reclaim_wait(&mut self) -> Option<AlignedBuf> {
        self.0.reclaim_wait()
    }
}

struct Run {
    hash: Options,
    open: OpenOptions,
    read_size: usize,
    progress: bool,
    cancel: Arc<AtomicBool>,
}

impl Run {
    fn checksum(&self, name: &str) -> io::Result<Checksum> {
        let input = blkimage::open(name, &self.open)?;
        let mut sink = HashSink(Hasher::with_buffers(self.hash.clone()).map_err(io::Error::other)?);
        let bar = self.progress_bar(name, &input);
        let mut progress = |n| bar.inc(n);
        let checksum = match input {
            Input::Image(src) => {
                let src: Arc<dyn Source> = Arc::from(src);
                blkimage::read_image(
                    src.clone(),
                    &mut sink,
                    self.read_size,
                    &self.cancel,
                    &mut progress,
                )?;
                let checksum = sink.0.try_finalize()?;
                // Only now are all reads done: is the image still what we read?
                src.finish()?;
                checksum
            }
            Input::Stream(mut r) => {
                blkimage::read_stream(
                    &mut r,
                    &mut sink,
                    self.read_size,
                    &self.cancel,
                    &mut progress,
                )?;
                sink.0.try_finalize()?
            }
        };
        bar.finish_and_clear();
        Ok(checksum)
    }

    fn progress_bar(&self, name: &str, input: &Input) -> ProgressBar {
        if !self.progress {
            return ProgressBar::hidden();
        }
        let bar = match input {
            Input::Image(src) => ProgressBar::new(src.size()).with_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
                )
                .unwrap()
                .progress_chars("=> "),
            ),
            Input::Stream(_) => ProgressBar::new_spinner().with_style(
                ProgressStyle::with_template("{prefix} {spinner} {bytes} {binary_bytes_per_sec}")
                    .unwrap(),
            ),
        };
        bar.with_prefix(name.to_string())
    }
}

fn list_digests() {
    for a in blkhash::ALGORITHMS {
        println!("{a}");
    }
}

/// Exit status for a run stopped by this signal, as a shell reports it.
fn signal_status(sig: usize) -> u8 {
    (128 + sig).min(255) as u8
}

fn main() -> ExitCode {
    let args = cli::Args::parse();
    if args.list_digests {
        list_digests();
        return ExitCode::SUCCESS;
    }
    let threads = args
        .threads
        .map_or_else(blkhash::default_threads, usize::from);
    let hash = Options::new()
        .algorithm(args.digest)
        .block_size(args.block_size)
        .threads(threads)
        .queue_depth(args.queue_depth.into());
    // Whole blocks per read: reads then go to the digest workers as they are.
    let read_size = args
        .read_size
        .unwrap_or(1 << 20)
        .next_multiple_of(args.block_size);

    // Ctrl-C and SIGTERM stop the run between reads; a second one kills at once.
    let cancel = Arc::new(AtomicBool::new(false));
    let signal = Arc::new(AtomicUsize::new(0));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register_conditional_shutdown(sig, 1, cancel.clone());
        let _ = signal_hook::flag::register(sig, cancel.clone());
        let _ = signal_hook::flag::register_usize(sig, signal.clone(), sig as usize);
    }

    let run = Run {
        hash,
        open: OpenOptions {
            cache: args.cache,
            format: args.format,
            no_backing: args.no_backing,
        },
        read_size,
        progress: args.progress,
        cancel: cancel.clone(),
    };
    let files = if args.files.is_empty() {
        vec!["-".to_string()]
    } else {
        args.files
    };
    let mut status = ExitCode::SUCCESS;
    let stdout = io::stdout();
    for name in &files {
        match run.checksum(name) {
            Ok(sum) => {
                let line = output::checksum_line(&sum.to_hex(), name);
                let mut out = stdout.lock();
                if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
                    // Standard output is gone (a closed pipe): nothing more to say.
                    return ExitCode::FAILURE;
                }
            }
            Err(_) if cancel.load(Ordering::Relaxed) => {
                eprintln!("blksum: {name}: interrupted");
                return ExitCode::from(signal_status(signal.load(Ordering::Relaxed)));
            }
            Err(e) => {
                eprintln!("blksum: {name}: {}", output::reason(&e));
                status = ExitCode::FAILURE;
            }
        }
    }
    status
}
