//! Writing DST: differing ranges after both maps are known, or every data
//! block on the fly while SRC is hashed (a DST known to hold only zeros).

use super::Error;
use super::known::Known;
use super::target::Target;
use blkimage::{AlignedBuf, Fill, Sink, Source};
use blkmap::Range;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes per write when copying ranges: large writes, few system calls.
pub const CHUNK: u64 = 8 << 20;

/// What the run has done so far, shared with the digest workers.
#[derive(Default)]
pub struct Counts {
    /// SRC bytes hashed (compared with DST's blocks).
    pub compared: AtomicU64,
    /// Data bytes written to DST.
    pub written: AtomicU64,
    /// Bytes made zeros in DST (holes punched or zeros written).
    pub zeroed: AtomicU64,
    /// Ranges written or zeroed.
    pub ranges: AtomicU64,
}

impl Counts {
    /// One count's value now.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// Where a run says how far it has come (the command draws it: blksync's
/// progress bar). Called from the run's threads, so `Sync`.
pub trait Progress: Sync {
    /// The run starts on `size` bytes of SRC in blocks of `block_size`;
    /// `compares` is false for a first copy, which compares nothing.
    fn start(&self, size: u64, block_size: usize, compares: bool) {
        let _ = (size, block_size, compares);
    }
    /// The counts have grown.
    fn update(&self, counts: &Counts) {
        let _ = counts;
    }
    /// The run has ended (well or not).
    fn finish(&self) {}
}

/// No progress shown.
impl Progress for () {}

/// Bytes a zeroing op covers at most: one hole punched per op, and
/// progress and Ctrl-C are seen between ops.
const ZERO_CHUNK: u64 = 1 << 30;

/// One thing to do to DST: copy a stretch of SRC, or make a stretch read
/// as zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    pub offset: u64,
    pub len: u64,
    pub zero: bool,
}

/// An op and, for a data op, the digests SRC's blocks had when they were
/// hashed (one per block, in order): what the copy must still read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub op: Op,
    pub digests: Vec<u8>,
}

impl Op {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// The most bytes one op may cover with blocks of `block_size`: a data
    /// op is whole blocks (so the blocks it copies can be digested again),
    /// read `CHUNK` bytes at a time.
    pub fn max_len(zero: bool, block_size: u64) -> u64 {
        match zero {
            true => ZERO_CHUNK,
            false if block_size >= CHUNK => block_size,
            false => CHUNK / block_size * block_size,
        }
    }

    /// Do it, for `job`. `buf` holds at least `CHUNK` bytes.
    pub fn apply(&self, w: &Writer<'_>, buf: &mut AlignedBuf, digests: &[u8]) -> Result<(), Error> {
        if w.cancel.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        Counts::add(&w.counts.ranges, 1);
        if self.zero {
            let b = &mut buf.spare()[..(self.len.min(CHUNK)) as usize];
            w.dst
                .zero_range(self.offset, self.len, b)
                .map_err(|e| Error::io(w.dst_name, e))?;
            Counts::add(&w.counts.zeroed, self.len);
        } else {
            let mut check = w
                .check
                .map(|(alg, bs)| Recheck::new((alg, w.key), bs, self, digests));
            let mut done = 0;
            while done < self.len {
                let n = (self.len - done).min(CHUNK) as usize;
                let b = &mut buf.spare()[..n];
                let at = self.offset + done;
                w.src.read_at(b, at).map_err(|e| Error::io(w.src_name, e))?;
                if let Some(c) = &mut check {
                    c.feed(b).map_err(|block| Error::SrcChanged {
                        src: w.src_name.to_string(),
                        block,
                        offset: block * c.bs,
                    })?;
                }
                w.dst
                    .write_at(b, at)
                    .map_err(|e| Error::io(w.dst_name, e))?;
                Counts::add(&w.counts.written, n as u64);
                done += n as u64;
            }
        }
        w.progress.update(w.counts);
        Ok(())
    }
}

/// SRC's blocks digested again as the copy reads them, against the digests
/// they had when SRC was hashed: a SRC written during the run (a VM still
/// running) fails the copy instead of leaving a state or a checksum that
/// does not describe DST.
struct Recheck<'a> {
    alg: blkhash::Algorithm,
    /// What the digests are keyed with (empty: nothing).
    key: &'a [u8],
    bs: u64,
    /// The next block to complete, its end (short at the op's end), and
    /// the digests left.
    block: u64,
    end: u64,
    op_end: u64,
    digests: &'a [u8],
    /// The digest of a block larger than one read, and its bytes so far.
    partial: Option<Box<dyn blkhash::Streaming>>,
    filled: usize,
    out: Vec<u8>,
}

impl<'a> Recheck<'a> {
    fn new(
        (alg, key): (blkhash::Algorithm, &'a [u8]),
        bs: u64,
        op: &Op,
        digests: &'a [u8],
    ) -> Recheck<'a> {
        Recheck {
            alg,
            key,
            bs,
            block: op.offset / bs,
            end: (op.offset + bs).min(op.end()),
            op_end: op.end(),
            digests,
            partial: None,
            filled: 0,
            out: vec![0; alg.output_len()],
        }
    }

    /// Take the next bytes of the op; `Err(block)` for a block whose
    /// digest is not the one hashed.
    fn feed(&mut self, mut data: &[u8]) -> Result<(), u64> {
        let dl = self.alg.output_len();
        while !data.is_empty() {
            let start = self.block * self.bs;
            let need = (self.end - start) as usize;
            let expect = self.digests.get(..dl).ok_or(self.block)?;
            match self.partial.take() {
                None if data.len() >= need => {
                    (self.alg).digest_keyed_into(&data[..need], self.key, &mut self.out);
                    data = &data[need..];
                }
                partial => {
                    // A block larger than one read: digested as it comes.
                    let mut s = partial.unwrap_or_else(|| self.alg.streaming());
                    let filled = self.filled;
                    let n = (need - filled).min(data.len());
                    s.update(&data[..n]);
                    data = &data[n..];
                    self.filled += n;
                    if self.filled < need {
                        self.partial = Some(s);
                        continue;
                    }
                    s.update(self.key);
                    self.out = s.finalize();
                }
            }
            if self.out != expect {
                return Err(self.block);
            }
            self.filled = 0;
            self.digests = &self.digests[dl..];
            self.block += 1;
            self.end = ((self.block + 1) * self.bs).min(self.op_end);
        }
        Ok(())
    }
}

/// What applying ops needs: both sides, their names, and the run's
/// counters, progress and Ctrl-C flag.
pub struct Writer<'a> {
    pub src: &'a dyn Source,
    pub src_name: &'a str,
    pub dst: &'a Target,
    pub dst_name: &'a str,
    pub counts: &'a Counts,
    pub progress: &'a dyn Progress,
    pub cancel: &'a AtomicBool,
    /// SRC's digest and block size, when the blocks copied must still be
    /// what was hashed (a state or a checksum will claim so).
    pub check: Option<(blkhash::Algorithm, u64)>,
    /// What SRC's block digests are keyed with (empty: nothing).
    pub key: &'a [u8],
}

/// A buffer for [`Op::apply`].
pub fn op_buffer() -> AlignedBuf {
    AlignedBuf::new(CHUNK as usize)
}

/// Copy `ranges` of SRC (whose map `map` is read on in block order as
/// they are: they come in order) to DST: data read and written in large
/// runs, zero blocks punched out or zeroed. Stops with an "interrupted"
/// error once `cancel` is set.
pub fn copy_ranges(w: &Writer<'_>, map: &mut Known, ranges: &[Range]) -> Result<(), Error> {
    let bs = map.block_size();
    let mut buf = op_buffer();
    let mut digests = Vec::new();
    for r in ranges {
        // From the start of its block (past a short DST's end a range starts
        // inside one): SRC's bytes before it are written again, harmlessly,
        // and the whole block can be digested again.
        let mut pos = r.offset / bs * bs;
        while pos < r.end() {
            // A stretch of whole blocks of one kind, at most an op's length,
            // their digests taken as the map is read on.
            let zero = block_of(w, map, pos / bs)?.is_none();
            let max = pos + Op::max_len(zero, bs);
            digests.clear();
            let mut end = pos;
            loop {
                match block_of(w, map, end / bs)? {
                    Some(d) if !zero => digests.extend_from_slice(d),
                    None if zero => {}
                    _ => break,
                }
                end = ((end / bs + 1) * bs).min(r.end());
                if end >= r.end() || end >= max {
                    break;
                }
            }
            let op = Op {
                offset: pos,
                len: end.min(max) - pos,
                zero,
            };
            op.apply(w, &mut buf, &digests)?;
            pos = op.end();
        }
    }
    Ok(())
}

/// Block `index` of SRC's map: its digest, `None` for a zero block.
fn block_of<'m>(w: &Writer<'_>, map: &'m mut Known, index: u64) -> Result<Option<&'m [u8]>, Error> {
    map.block(index).map_err(|e| {
        let e = io::Error::from(e.of("SRC's map"));
        Error::io(w.src_name, e)
    })
}

/// A sink for SRC when DST is known to hold only zeros (new, empty, or a
/// file with no data allocated): each chunk is written to DST on the
/// digest worker that read it, right after the read, its zero blocks
/// skipped (they are holes already). SRC is read once, and writes run in
/// parallel with hashing.
pub struct WriteThrough<'a> {
    /// The hasher, or reading threads in front of it (then each chunk is
    /// read and written on a reading thread).
    pub hasher: &'a mut dyn Sink,
    pub dst: Arc<Target>,
    pub dst_name: Arc<str>,
    pub block_size: usize,
    pub counts: Arc<Counts>,
    /// The first write that failed: it is DST's fault, not SRC's.
    pub failed: Arc<Mutex<Option<Error>>>,
    pub pos: u64,
    /// DST will be flushed at the end: start writing each chunk back now.
    pub flush_later: bool,
}

impl Sink for WriteThrough<'_> {
    fn read(&mut self, len: usize, fill: Fill) -> io::Result<()> {
        let offset = self.pos;
        self.pos += len as u64;
        let (dst, name, counts, failed) = (
            self.dst.clone(),
            self.dst_name.clone(),
            self.counts.clone(),
            self.failed.clone(),
        );
        let bs = self.block_size;
        let early = self.flush_later;
        Sink::read(
            self.hasher,
            len,
            Box::new(move |buf: &mut [u8]| {
                fill(buf)?;
                write_data(&dst, buf, offset, bs, &counts)
                    .and_then(|()| match early {
                        true => dst.start_writeback(offset, buf.len()),
                        false => Ok(()),
                    })
                    .map_err(|e| {
                        let kind = e.kind();
                        let err = Error::io(&name, e);
                        let returned = io::Error::new(kind, err.to_string());
                        failed
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(err);
                        returned
                    })
            }),
        )
    }

    fn data(&mut self, buf: AlignedBuf) -> io::Result<()> {
        // Images come as reads; this is for completeness (streams).
        write_data(&self.dst, &buf, self.pos, self.block_size, &self.counts)?;
        self.pos += buf.len() as u64;
        Sink::data(self.hasher, buf)
    }

    fn zeros(&mut self, len: u64) -> io::Result<()> {
        self.pos += len;
        Sink::zeros(self.hasher, len)
    }

    fn reclaim(&mut self) -> Option<AlignedBuf> {
        Sink::reclaim(self.hasher)
    }

    fn reclaim_wait(&mut self) -> Option<AlignedBuf> {
        Sink::reclaim_wait(self.hasher)
    }
}

/// A sink for SRC when DST is known to hold only zeros and nothing needs
/// SRC's digests (no state to save, nothing to verify or print): workers
/// read each chunk and write its data blocks to DST, zero blocks skipped.
/// Hashing SRC would double the CPU work of a plain copy; this does what
/// `qemu-img convert` does, on every core.
pub struct CopyThrough {
    jobs: Option<crossbeam_channel::Sender<CopyJob>>,
    workers: Vec<std::thread::JoinHandle<()>>,
    /// The first failure, named after the input it is about.
    failed: Arc<Mutex<Option<Error>>>,
    dst: Arc<Target>,
    block_size: usize,
    counts: Arc<Counts>,
    pos: u64,
    /// The buffer of the last `data` call, handed back by `reclaim`.
    spare: Option<AlignedBuf>,
}

struct CopyJob {
    offset: u64,
    len: usize,
    fill: Fill,
}

/// Where `CopyThrough` reads and writes, and how.
pub struct CopyTarget {
    pub src_name: Arc<str>,
    pub dst: Arc<Target>,
    pub dst_name: Arc<str>,
    pub block_size: usize,
    pub threads: usize,
    pub counts: Arc<Counts>,
    /// DST will be flushed at the end: start writing each chunk back now.
    pub flush_later: bool,
}

impl CopyThrough {
    /// Start the workers; an error only if none could start (the system's
    /// limit on threads): fewer workers copy the same, more slowly.
    pub fn new(t: CopyTarget) -> io::Result<CopyThrough> {
        let threads = t.threads.max(1);
        let mut spawn_error = None;
        // A job queued per worker keeps every worker busy while bounding
        // the memory in flight (one chunk buffer per worker).
        let (tx, rx) = crossbeam_channel::bounded::<CopyJob>(threads);
        let failed = Arc::new(Mutex::new(None));
        let workers = (0..threads)
            .map(|i| {
                let (rx, failed) = (rx.clone(), failed.clone());
                let (dst, src_name, dst_name) =
                    (t.dst.clone(), t.src_name.clone(), t.dst_name.clone());
                let (counts, bs, early) = (t.counts.clone(), t.block_size, t.flush_later);
                std::thread::Builder::new()
                    .name(format!("blksync-{i}"))
                    .spawn(move || {
                        let mut buf: Option<AlignedBuf> = None;
                        for job in rx {
                            if failed.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                                continue; // drain: the run has failed
                            }
                            if buf.as_ref().is_none_or(|b| b.capacity() < job.len) {
                                // The small one first: both at once may be
                                // more than there is.
                                buf = None;
                                match AlignedBuf::try_new(job.len, "a read") {
                                    Ok(b) => buf = Some(b),
                                    Err(e) => {
                                        failed
                                            .lock()
                                            .unwrap_or_else(|p| p.into_inner())
                                            .get_or_insert(Error::io(&src_name, e));
                                        continue;
                                    }
                                }
                            }
                            let Some(b) = buf.as_mut() else { continue };
                            let b = &mut b.spare()[..job.len];
                            let result = (job.fill)(b)
                                .map_err(|e| Error::io(&src_name, e))
                                .and_then(|()| {
                                    write_data(&dst, b, job.offset, bs, &counts)
                                        .and_then(|()| match early {
                                            true => dst.start_writeback(job.offset, b.len()),
                                            false => Ok(()),
                                        })
                                        .map_err(|e| Error::io(&dst_name, e))
                                });
                            if let Err(e) = result {
                                failed
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .get_or_insert(e);
                            }
                        }
                    })
            })
            .map_while(|spawned| spawned.map_err(|e| spawn_error = Some(e)).ok())
            .collect::<Vec<_>>();
        if let (true, Some(e)) = (workers.is_empty(), spawn_error) {
            return Err(io::Error::new(
                e.kind(),
                format!("cannot start a copy thread: {e}"),
            ));
        }
        Ok(CopyThrough {
            jobs: Some(tx),
            workers,
            failed,
            dst: t.dst,
            block_size: t.block_size,
            counts: t.counts,
            pos: 0,
            spare: None,
        })
    }

    fn failed(&self) -> bool {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Wait for every queued chunk; the first failure, named.
    pub fn finish(mut self) -> Result<(), Error> {
        self.stop();
        let failed = self.failed.lock().unwrap_or_else(|p| p.into_inner()).take();
        failed.map_or(Ok(()), Err)
    }

    fn stop(&mut self) {
        self.jobs = None;
        for w in self.workers.drain(..) {
            w.join().expect("blksync worker panicked");
        }
    }
}

impl Drop for CopyThrough {
    fn drop(&mut self) {
        // An early return (an interrupted read loop) still waits for the
        // writes in flight: none may land after the caller moves on.
        self.stop();
    }
}

impl Sink for CopyThrough {
    fn read(&mut self, len: usize, fill: Fill) -> io::Result<()> {
        if self.failed() {
            // finish() reports the failure itself, named.
            return Err(io::Error::other("a write to DST failed"));
        }
        let offset = self.pos;
        self.pos += len as u64;
        let job = CopyJob { offset, len, fill };
        self.jobs
            .as_ref()
            .expect("sink in use")
            .send(job)
            .expect("blksync workers died");
        Ok(())
    }

    fn data(&mut self, buf: AlignedBuf) -> io::Result<()> {
        // Images come as reads; this is for completeness (streams).
        write_data(&self.dst, &buf, self.pos, self.block_size, &self.counts)?;
        self.pos += buf.len() as u64;
        self.spare = Some(buf);
        Ok(())
    }

    fn zeros(&mut self, len: u64) -> io::Result<()> {
        // DST holds zeros there already.
        self.pos += len;
        Ok(())
    }

    fn reclaim(&mut self) -> Option<AlignedBuf> {
        self.spare.take()
    }

    fn reclaim_wait(&mut self) -> Option<AlignedBuf> {
        self.spare.take()
    }
}

/// Write `buf` (SRC's bytes at `offset`) to a DST of zeros: runs of blocks
/// holding data, one write each; zero blocks skipped.
fn write_data(dst: &Target, buf: &[u8], offset: u64, bs: usize, counts: &Counts) -> io::Result<()> {
    let mut start = None;
    let mut at = 0;
    for block in buf.chunks(bs) {
        match (blkhash::is_zero(block), start) {
            (false, None) => start = Some(at),
            (true, Some(s)) => {
                dst.write_at(&buf[s..at], offset + s as u64)?;
                Counts::add(&counts.written, (at - s) as u64);
                Counts::add(&counts.ranges, 1);
                start = None;
            }
            _ => {}
        }
        at += block.len();
    }
    if let Some(s) = start {
        dst.write_at(&buf[s..], offset + s as u64)?;
        Counts::add(&counts.written, (buf.len() - s) as u64);
        Counts::add(&counts.ranges, 1);
    }
    Ok(())
}
