//! Reading an image in guest order into a sink, with reads in parallel.
//!
//! Zero and unallocated extents are passed on as lengths, never read. Data
//! extents are cut into `read_size` chunks read by a few threads (which is
//! where a format's decompression runs, in parallel), and handed to the sink
//! in order, buffer and all: nothing is copied on the way.

use crate::buffer::AlignedBuf;
use crate::source::{ExtentKind, Source};
use crossbeam_channel::{Receiver, Sender};
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, Ordering};

/// Where the bytes go, in guest order.
pub trait Sink {
    /// The next bytes, in a buffer the sink owns until it gives it back.
    fn data(&mut self, buf: AlignedBuf);
    /// The next `len` bytes read as zeros.
    fn zeros(&mut self, len: u64);
    /// A buffer the sink is done with, if any.
    fn reclaim(&mut self) -> Option<AlignedBuf>;
    /// A buffer the sink is done with, waiting for one if it holds any.
    fn reclaim_wait(&mut self) -> Option<AlignedBuf>;
}

/// How to read.
#[derive(Clone, Debug)]
pub struct ReadOptions {
    /// Bytes per read request.
    pub read_size: usize,
    /// Reads in flight (and reading threads).
    pub queue_depth: usize,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            read_size: 1 << 20,
            queue_depth: 4,
        }
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
    pub fn total(&self) -> u64 {
        self.data + self.zero + self.hole
    }
}

/// The error for a run stopped by `cancel`.
pub fn interrupted() -> io::Error {
    io::Error::new(io::ErrorKind::Interrupted, "interrupted")
}

enum Item {
    Zeros(u64),
    Read(u64),
}

type Request = (u64, u64, usize, AlignedBuf);
type Reply = (u64, AlignedBuf, io::Result<()>);

/// Read all of `src` into `sink`. `progress` gets the bytes passed on since its last call.
pub fn read_image(
    src: &dyn Source,
    sink: &mut dyn Sink,
    opts: &ReadOptions,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Stats> {
    let depth = opts.queue_depth.max(1);
    let (req_tx, req_rx) = crossbeam_channel::unbounded::<Request>();
    let (rep_tx, rep_rx) = crossbeam_channel::unbounded::<Reply>();
    let stats = std::thread::scope(|s| {
        for _ in 0..depth {
            let req_rx = req_rx.clone();
            let rep_tx = rep_tx.clone();
            s.spawn(move || {
                for (seq, offset, len, mut buf) in req_rx {
                    let r = src.read_at(&mut buf.spare()[..len], offset);
                    buf.set_len(len);
                    if rep_tx.send((seq, buf, r)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(rep_tx);
        let mut pipe = Pipeline {
            src,
            sink,
            opts,
            depth,
            req_tx,
            rep_rx,
            order: VecDeque::new(),
            ready: HashMap::new(),
            free: Vec::new(),
            allocated: 0,
            in_flight: 0,
            next_seq: 0,
            stats: Stats::default(),
        };
        pipe.run(cancel, progress)
        // Dropping the pipeline closes the request channel: readers finish.
    })?;
    src.finish()?;
    Ok(stats)
}

struct Pipeline<'a> {
    src: &'a dyn Source,
    sink: &'a mut dyn Sink,
    opts: &'a ReadOptions,
    depth: usize,
    req_tx: Sender<Request>,
    rep_rx: Receiver<Reply>,
    order: VecDeque<Item>,
    ready: HashMap<u64, AlignedBuf>,
    free: Vec<AlignedBuf>,
    allocated: usize,
    in_flight: usize,
    next_seq: u64,
    stats: Stats,
}

impl Pipeline<'_> {
    fn max_buffers(&self) -> usize {
        // Reads in flight, plus as many waiting in order or in the sink.
        2 * self.depth + 2
    }

    fn run(&mut self, cancel: &AtomicBool, progress: &mut dyn FnMut(u64)) -> io::Result<Stats> {
        let size = self.src.size();
        let mut pos = 0u64;
        let mut extent = None;
        loop {
            if cancel.load(Ordering::Relaxed) {
                return Err(interrupted());
            }
            self.deliver(progress);
            if pos < size && self.in_flight < self.depth {
                let ext = match extent {
                    Some(e) => e,
                    None => {
                        let e = *self.src.extents(pos, size - pos)?.first().ok_or_else(|| {
                            io::Error::other(format!("no extent at offset {pos}"))
                        })?;
                        if e.offset != pos || e.len == 0 || e.end() > size {
                            return Err(io::Error::other(format!(
                                "bad extent {e:?} at offset {pos}"
                            )));
                        }
                        e
                    }
                };
                if ext.kind.is_zero() {
                    match ext.kind {
                        ExtentKind::Zero => self.stats.zero += ext.len,
                        _ => self.stats.hole += ext.len,
                    }
                    match self.order.back_mut() {
                        Some(Item::Zeros(n)) => *n += ext.len,
                        _ => self.order.push_back(Item::Zeros(ext.len)),
                    }
                    pos = ext.end();
                    extent = None;
                    continue;
                }
                if let Some(buf) = self.take_buffer() {
                    let n = (ext.end() - pos).min(self.opts.read_size as u64);
                    let seq = self.next_seq;
                    self.next_seq += 1;
                    self.req_tx
                        .send((seq, pos, n as usize, buf))
                        .expect("reader threads live while the pipeline does");
                    self.order.push_back(Item::Read(seq));
                    self.in_flight += 1;
                    self.stats.data += n;
                    pos += n;
                    extent = (pos < ext.end()).then_some(ext);
                    continue;
                }
            }
            if self.in_flight > 0 {
                let (seq, buf, r) = self.rep_rx.recv().expect("reader threads live");
                self.in_flight -= 1;
                r?;
                self.ready.insert(seq, buf);
            } else if pos < size {
                // Every buffer is in the sink: wait for one back.
                let buf = self
                    .sink
                    .reclaim_wait()
                    .ok_or_else(|| io::Error::other("sink holds no buffer to give back"))?;
                self.free.push(buf);
            } else {
                self.deliver(progress);
                debug_assert!(self.order.is_empty());
                return Ok(self.stats);
            }
        }
    }

    fn take_buffer(&mut self) -> Option<AlignedBuf> {
        if let Some(b) = self.free.pop().or_else(|| self.sink.reclaim()) {
            return Some(b);
        }
        if self.allocated < self.max_buffers() {
            self.allocated += 1;
            return Some(AlignedBuf::new(self.opts.read_size));
        }
        None
    }

    /// Pass on everything at the head of the order that is ready.
    fn deliver(&mut self, progress: &mut dyn FnMut(u64)) {
        while let Some(item) = self.order.front() {
            match *item {
                Item::Zeros(n) => {
                    self.sink.zeros(n);
                    progress(n);
                }
                Item::Read(seq) => {
                    let Some(buf) = self.ready.remove(&seq) else {
                        return;
                    };
                    progress(buf.len() as u64);
                    self.sink.data(buf);
                }
            }
            self.order.pop_front();
        }
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
        sink.data(buf);
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
