//! Reading an image in guest order into a sink.
//!
//! Zero and unallocated extents are passed on as lengths, never read. Data
//! extents are cut into `read_size` chunks, each passed on as a read to do
//! (a [`Fill`]): the sink runs the reads where it likes — a hasher runs them
//! on its digest workers, in parallel, so a chunk is digested by the core
//! that just read it (and a format's decompression runs in parallel too).

use crate::buffer::AlignedBuf;
use crate::source::{ExtentKind, Source};
use std::io::{self, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Produces a chunk's bytes: fills the whole slice, or fails.
pub type Fill = Box<dyn FnOnce(&mut [u8]) -> io::Result<()> + Send>;

/// Where the bytes go, in guest order.
pub trait Sink {
    /// The next `len` bytes, which `fill` produces when the sink runs it.
    fn read(&mut self, len: usize, fill: Fill) -> io::Result<()>;
    /// The next bytes, already read, in a buffer the sink owns until it
    /// gives it back from `reclaim`.
    fn data(&mut self, buf: AlignedBuf) -> io::Result<()>;
    /// The next `len` bytes read as zeros.
    fn zeros(&mut self, len: u64) -> io::Result<()>;
    /// A buffer the sink is done with, if any.
    fn reclaim(&mut self) -> Option<AlignedBuf>;
    /// A buffer the sink is done with, waiting for one if it holds any.
    fn reclaim_wait(&mut self) -> Option<AlignedBuf>;
}

/// The hasher is the sink everything here feeds: reads run on its digest
/// workers, read buffers are handed over without a copy, zeros cost nothing.
impl Sink for blkhash::Pipeline<AlignedBuf> {
    fn read(&mut self, len: usize, fill: Fill) -> io::Result<()> {
        self.submit_with(len, fill)
    }
    fn data(&mut self, buf: AlignedBuf) -> io::Result<()> {
        self.submit(buf);
        Ok(())
    }
    fn zeros(&mut self, len: u64) -> io::Result<()> {
        self.update_zeros(len);
        Ok(())
    }
    fn reclaim(&mut self) -> Option<AlignedBuf> {
        blkhash::Pipeline::reclaim(self)
    }
    fn reclaim_wait(&mut self) -> Option<AlignedBuf> {
        blkhash::Pipeline::reclaim_wait(self)
    }
}

/// What was found, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Read from the image.
    pub data: u64,
    /// Allocated zeros, not read.
    pub zero: u64,
    /// Unallocated, not read.
    pub hole: u64,
}

impl Stats {
    /// Every guest byte accounted for: data, zeros and holes.
    pub fn total(&self) -> u64 {
        self.data + self.zero + self.hole
    }
}

/// The error for a run stopped by `cancel`.
pub fn interrupted() -> io::Error {
    io::Error::new(io::ErrorKind::Interrupted, "interrupted")
}

/// Read all of `src` into `sink`, `read_size` bytes per read.
/// `progress` gets the bytes passed on since its last call.
///
/// The sink may still be running reads when this returns: once it has
/// finished them, call [`Source::finish`] before trusting the result.
pub fn read_image(
    src: Arc<dyn Source>,
    sink: &mut dyn Sink,
    read_size: usize,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Stats> {
    let size = src.size();
    let read_size = read_size.max(1) as u64;
    let mut stats = Stats::default();
    let mut pos = 0u64;
    while pos < size {
        for e in src.extents(pos, size - pos)? {
            if e.offset != pos || e.len == 0 || e.end() > size {
                return Err(io::Error::other(format!(
                    "bad extent {e:?} at offset {pos}"
                )));
            }
            match e.kind {
                ExtentKind::Zero => stats.zero += e.len,
                ExtentKind::Hole => stats.hole += e.len,
                ExtentKind::Data => stats.data += e.len,
            }
            if e.kind.is_zero() {
                sink.zeros(e.len)?;
                progress(e.len);
            } else {
                while pos < e.end() {
                    if cancel.load(Ordering::Relaxed) {
                        return Err(interrupted());
                    }
                    // Cut at multiples of the read size, so that after a
                    // data extent starting mid-block the chunks are whole
                    // blocks again.
                    let n = e.end().min((pos / read_size + 1) * read_size) - pos;
                    let (src, offset) = (src.clone(), pos);
                    sink.read(n as usize, Box::new(move |buf| src.read_at(buf, offset)))?;
                    progress(n);
                    pos += n;
                }
            }
            pos = e.end();
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(interrupted());
        }
    }
    Ok(stats)
}

/// Read a stream (a pipe) to its end into `sink`: its length is what was
/// read; zero detection is the sink's business.
pub fn read_stream(
    input: &mut dyn Read,
    sink: &mut dyn Sink,
    read_size: usize,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Stats> {
    const MAX_BUFFERS: usize = 8;
    let mut allocated = 0;
    let mut stats = Stats::default();
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(interrupted());
        }
        let mut buf = match sink.reclaim() {
            Some(b) => b,
            None if allocated < MAX_BUFFERS => {
                allocated += 1;
                AlignedBuf::new(read_size)
            }
            None => sink
                .reclaim_wait()
                .ok_or_else(|| io::Error::other("sink holds no buffer to give back"))?,
        };
        let n = read_full(input, &mut buf.spare()[..read_size], cancel)?;
        buf.set_len(n);
        stats.data += n as u64;
        progress(n as u64);
        sink.data(buf)?;
        if n < read_size {
            return Ok(stats);
        }
    }
}

/// Read until `buf` is full or the end of input; the count read.
fn read_full(input: &mut dyn Read, buf: &mut [u8], cancel: &AtomicBool) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match input.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                if cancel.load(Ordering::Relaxed) {
                    return Err(interrupted());
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
