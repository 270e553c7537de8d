//! Reading an image in guest order into a sink.
//!
//! Zero and unallocated extents are passed on as lengths, never read. Data
//! extents are cut into `read_size` chunks, each passed on as a read to do
//! (a [`Fill`](crate::Fill)), or, where the source lends them in place (a
//! file read from memory maps: [`Source::lendable`]) and the sink digests
//! them there (the hasher, with reads on its workers), as a
//! [`Lend`](crate::Lend) the digest worker reads without a copy. Where the
//! reads run depends on the I/O depth: with none
//! the sink runs them where it likes — a hasher runs them on its digest
//! workers, in parallel, so a chunk is digested by the core that just read
//! it (right for the page cache, where a read is a copy); with an I/O depth
//! they run on reading threads of their own ([`ReadAhead`]), so a device
//! read with direct I/O gets that many reads in flight whatever the number
//! of digest threads.

use crate::buffer::AlignedBuf;
use crate::readahead::ReadAhead;
use crate::sink::Sink;
use crate::source::{ExtentKind, Source};
use std::io::{self, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What was found, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Read from the image.
    pub data: u64,
    /// Allocated zeros, not read.
    pub zero: u64,
    /// Unallocated, not read.
    pub hole: u64,
    /// Of `data`, the bytes digested in place from memory maps (the rest
    /// were copied); known once every read is done
    /// ([`InputRead::mapped_bytes`]).
    pub mapped: u64,
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

pub use crate::source::{DEFAULT_IO_DEPTH, DIRECT_BYTES_IN_FLIGHT, direct_io_depth};

/// Read all of `src` into `sink`, `read_size` bytes per read, `io_depth`
/// reads in flight on reading threads of their own (`Some(0)`: on the
/// sink's; `None`: the source's default, [`io_depth_for`]), as many as fit in [`blkhash::IN_FLIGHT_BUDGET`]
/// (see [`ReadAhead::new`]). `progress` gets the bytes passed on since its
/// last call.
///
/// The sink may still be running reads when this returns: once it has
/// finished them, call [`Source::finish`] before trusting the result.
pub fn read_image(
    src: Arc<dyn Source>,
    sink: &mut dyn Sink,
    read_size: usize,
    io_depth: Option<usize>,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Stats> {
    let read_size = src.read_size(read_size);
    let depth = io_depth_for(&*src, io_depth, read_size);
    if depth == 0 {
        return walk(src, sink, read_size, cancel, progress);
    }
    // A depth asked for is a count of reads; the source's own may come
    // with a bound in bytes (Source::bytes_in_flight).
    let max_bytes = io_depth.is_none().then(|| src.bytes_in_flight()).flatten();
    std::thread::scope(|scope| {
        let mut ahead = match max_bytes {
            Some(m) => ReadAhead::with_bytes(scope, sink, depth, read_size, m)?,
            None => ReadAhead::new(scope, sink, depth, read_size)?,
        };
        let stats = walk(src, &mut ahead, read_size, cancel, progress)?;
        ahead.flush()?;
        Ok(stats)
    })
}

/// The reads in flight for `src` with reads of `read_size` bytes: `asked`,
/// else the source's default ([`Source::default_io_depth`]: 4 MiB of reads
/// for direct I/O, 16 MiB for an NBD export, else 0, reads on the sink's
/// threads); before [`ReadAhead::new`] cuts it to the memory budget.
pub fn io_depth_for(src: &dyn Source, asked: Option<usize>, read_size: usize) -> usize {
    asked.unwrap_or_else(|| src.default_io_depth(read_size))
}

/// Bytes a source read in place (a memory map of a cached file) lends at
/// once, at least: each lend is mapped, populated and unmapped on the
/// worker that digests it, and every unmap stops every core to flush its
/// TLB. Measured on 1 and 2 GiB cached files (docs/performance.md, hot
/// images): lends of 2 MiB took 0.86-0.93x the time of lends of the 1 MiB
/// read size; 4 and 8 MiB were no better for BLAKE3 and slower for
/// SHA-256 on one of the two files. No byte is copied either way.
const LEND_SIZE: u64 = 2 << 20;

/// Walk the extents of `src`: zeros and holes passed on as lengths, data
/// as reads of at most `read_size` bytes, or lends of at most
/// [`LEND_SIZE`] (or `read_size` if larger) where the source lends.
fn walk(
    src: Arc<dyn Source>,
    sink: &mut dyn Sink,
    read_size: usize,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Stats> {
    let size = src.size();
    let read_size = read_size.max(1) as u64;
    // A multiple of the read size, so that lends end where reads would.
    let lend_size = LEND_SIZE.div_ceil(read_size) * read_size;
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
                    let mut n = e.end().min((pos / read_size + 1) * read_size) - pos;
                    let (src, offset) = (src.clone(), pos);
                    let lendable = match sink.takes_lends() {
                        true => {
                            let most = e.end().min((pos / lend_size + 1) * lend_size) - pos;
                            src.lendable(pos, most as usize).min(most as usize)
                        }
                        false => 0,
                    };
                    match lendable {
                        0 => {
                            sink.read(n as usize, Box::new(move |buf| src.read_at(buf, offset)))?
                        }
                        lent => {
                            n = lent as u64;
                            sink.lend(lent, Box::new(move |f| src.read_in_place(offset, lent, f)))?
                        }
                    }
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

/// An input read by [`read_input`]: what was found, its format ("raw",
/// "qcow2", ... or "stream"), and the image to finish.
pub struct InputRead {
    /// What was found, in bytes.
    pub stats: Stats,
    /// The image's format, or "stream".
    pub format: String,
    /// The file's size, if the guest size was rounded up from it
    /// ([`Source::rounded`]): for the command to say so.
    pub rounded: Option<crate::Rounded>,
    /// How a compressed image was decompressed into a temporary file, if
    /// it was ([`Source::decompressed`]): for the command to say so.
    pub decompressed: Option<crate::Decompressed>,
    image: Option<Arc<dyn Source>>,
}

impl InputRead {
    /// Call once the sink has finished every read (the hasher finalized):
    /// an error if the image changed under the reads ([`Source::finish`]).
    pub fn finish(&self) -> io::Result<()> {
        self.image.as_ref().map_or(Ok(()), |s| s.finish())
    }

    /// Of the data, the bytes digested in place from memory maps, once the
    /// sink has finished every read ([`Source::mapped_bytes`]).
    pub fn mapped_bytes(&self) -> u64 {
        self.image.as_ref().map_or(0, |s| s.mapped_bytes())
    }
}

/// Read an opened input into `sink`: an image with [`read_image`], a stream
/// with [`read_stream`]. Finalize the sink, then call [`InputRead::finish`]
/// before trusting the result.
pub fn read_input(
    input: crate::Input,
    sink: &mut dyn Sink,
    read_size: usize,
    io_depth: Option<usize>,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64),
) -> io::Result<InputRead> {
    match input {
        crate::Input::Image(src) => {
            let src: Arc<dyn Source> = Arc::from(src);
            let stats = read_image(src.clone(), sink, read_size, io_depth, cancel, progress)?;
            Ok(InputRead {
                stats,
                format: src.format().to_string(),
                rounded: src.rounded(),
                decompressed: src.decompressed(),
                image: Some(src),
            })
        }
        crate::Input::Stream(mut r) => Ok(InputRead {
            stats: read_stream(&mut r, sink, read_size, cancel, progress)?,
            format: "stream".to_string(),
            rounded: None,
            decompressed: None,
            image: None,
        }),
    }
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
                AlignedBuf::try_new(read_size, "a read")?
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
