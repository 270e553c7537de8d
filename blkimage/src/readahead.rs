//! Reads in flight apart from the digest workers.
//!
//! A device read with direct I/O is fast only with many reads in flight (an
//! NVMe drive wants 16 to 32 of 1 MiB; fio's iodepth), while the digest
//! workers are one per core. [`ReadAhead`] is a [`Sink`] in front of the
//! hasher: each read runs on one of `depth` reading threads into a buffer of
//! its own, and the buffers are handed to the hasher in guest order, as they
//! complete, without a copy; zeros wait in the same queue so the order holds.
//!
//! A small pool of threads blocked in `pread` was chosen over io_uring: it
//! works for every source (qcow2, an NBD source's own reads), on every
//! kernel, with nothing to fall back from, and with 1 MiB reads the cost of
//! a thread switch per read is noise next to the read itself.
//!
//! Memory: at most `2 × depth` buffers of the read size are allocated (the
//! reads in flight, and as many waiting in the hasher's queue or being
//! digested; `depth` + its workers for a hasher that says how many it has,
//! [`Sink::busy_with`]: 6 MiB, not 8, for 4 reads of 1 MiB in front of 2
//! workers), on top of what the hasher itself holds; the depth is cut so
//! that they fit in [`blkhash::IN_FLIGHT_BUDGET`] (256 MiB), whatever depth
//! and read size are asked for.
//!
//! A source across a network may also bound its reads in flight by bytes
//! ([`ReadAhead::with_bytes`]): then many small reads (the scattered
//! clusters of a qcow2 image over HTTP) keep many requests waiting on the
//! network's latency, and a few large ones no more memory than that.

use crate::buffer::AlignedBuf;
use crate::sink::{Fill, Sink};
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::Scope;

/// One read for a reading thread: fill `len` bytes of `buf`, send it back.
struct Job {
    buf: AlignedBuf,
    len: usize,
    fill: Fill,
    done: SyncSender<io::Result<AlignedBuf>>,
}

/// What comes next in guest order.
enum Pending {
    /// A read of so many bytes on a reading thread.
    Read(Receiver<io::Result<AlignedBuf>>, usize),
    /// Zeros, passed on once the reads before them are.
    Zeros(u64),
}

/// A [`Sink`] that runs reads on `depth` reading threads and passes their
/// bytes on to `inner` in order. Call [`ReadAhead::flush`] before using
/// what `inner` received; dropping it stops the reads not yet started.
pub struct ReadAhead<'sink> {
    inner: &'sink mut dyn Sink,
    jobs: Option<mpsc::Sender<Job>>,
    /// Set on drop: queued reads are skipped, not run.
    stop: Arc<AtomicBool>,
    pending: VecDeque<Pending>,
    /// The reads in `pending` (zeros there take no reading thread).
    reads: usize,
    depth: usize,
    /// Bytes of the reads in `pending`, and the most allowed, if bounded
    /// by bytes ([`ReadAhead::with_bytes`]).
    bytes: usize,
    max_bytes: Option<usize>,
    allocated: usize,
    /// With a bound in bytes: the capacity of every buffer made here and
    /// not yet dropped (in flight, spare, or in the hasher).
    held: usize,
    spare: Vec<AlignedBuf>,
}

/// Bytes of reads waiting for the hasher at most, besides those in flight,
/// under a bound in bytes: they smooth a run whose reads come in bursts (a
/// URL at 0 ms took 4% longer with only the digest workers' reads
/// waiting), and more would not make the hasher faster: twice the 46 MiB
/// a URL keeps in flight at 10 ms would hold 92 MiB.
const WAITING: usize = 16 << 20;
/// Bytes of buffers at most under a bound in bytes larger than this: the
/// reads in flight and those waiting then share it. A URL's bound follows
/// the first request's time, one sample a busy machine can stretch (a run
/// at 10 ms without this bound peaked at 89 MiB of RSS).
const MOST_HELD: usize = 64 << 20;

impl<'sink> ReadAhead<'sink> {
    /// Reading threads spawned in `scope`, in front of `inner`, for reads
    /// of at most `read_size` bytes: `depth` of them, cut to what fits in
    /// [`blkhash::IN_FLIGHT_BUDGET`] (each read in flight may have a second
    /// buffer waiting in the hasher), at least 1. A thread the system will
    /// not start (its limit on threads) is an error, the threads started
    /// stopped.
    pub fn new<'scope, 'env>(
        scope: &'scope Scope<'scope, 'env>,
        inner: &'sink mut dyn Sink,
        depth: usize,
        read_size: usize,
    ) -> io::Result<Self> {
        let depth = blkhash::depth_within_budget(depth, 2 * read_size);
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let stop = Arc::new(AtomicBool::new(false));
        for i in 0..depth {
            let (rx, stop) = (rx.clone(), stop.clone());
            // Each thread is awaited until it runs: what the system maps
            // for it as it starts is then mapped before the next thread or
            // any read buffer takes the room (see room_for_thread).
            let (started, running) = mpsc::channel::<()>();
            let spawned = blkhash::room_for_thread().and_then(|room| {
                let t = std::thread::Builder::new()
                    .name(format!("blkimage-read-{i}"))
                    .spawn_scoped(scope, move || {
                        drop(started);
                        loop {
                            // The lock is held only to take a job, not to run it.
                            let job = match rx.lock() {
                                Ok(rx) => rx.recv(),
                                Err(_) => return,
                            };
                            let Ok(mut job) = job else { return };
                            if stop.load(Ordering::Relaxed) {
                                continue;
                            }
                            let r = (job.fill)(&mut job.buf.spare()[..job.len]).map(|()| {
                                job.buf.set_len(job.len);
                                job.buf
                            });
                            // The receiver is gone if the run already failed.
                            let _ = job.done.send(r);
                        }
                    });
                t.map(|_| room)
            });
            let room = spawned.map_err(|e| {
                let shown = format!("cannot start a reading thread: {e}");
                crate::with_context(e, shown)
            })?;
            let _ = running.recv();
            drop(room);
        }
        Ok(ReadAhead {
            inner,
            jobs: Some(tx),
            stop,
            pending: VecDeque::new(),
            reads: 0,
            depth,
            bytes: 0,
            max_bytes: None,
            allocated: 0,
            held: 0,
            spare: Vec::new(),
        })
    }

    /// As [`ReadAhead::new`], the reads in flight also bounded by bytes:
    /// at most `depth` of them, and at most `max_bytes` of reads (one read
    /// whatever its size). The buffers then hold about twice that, up to
    /// that and 16 MiB (those in flight and those waiting in the hasher)
    /// and 64 MiB in all, however many reads there are.
    pub fn with_bytes<'scope, 'env>(
        scope: &'scope Scope<'scope, 'env>,
        inner: &'sink mut dyn Sink,
        depth: usize,
        read_size: usize,
        max_bytes: usize,
    ) -> io::Result<Self> {
        let mut ahead = ReadAhead::new(scope, inner, depth, read_size)?;
        ahead.max_bytes = Some(max_bytes);
        Ok(ahead)
    }

    /// A buffer of at least `len` bytes: one given back by the hasher, else
    /// a new one while fewer than [`ReadAhead::most_buffers`] exist, else
    /// the next one the hasher gives back.
    fn buffer(&mut self, len: usize) -> io::Result<AlignedBuf> {
        if let Some(m) = self.max_bytes {
            return self.buffer_within(len, m);
        }
        while let Some(b) = self.inner.reclaim() {
            self.spare.push(b);
        }
        let buf = match self.spare.pop() {
            Some(b) => b,
            None if self.allocated < self.most_buffers() => {
                let buf = AlignedBuf::try_new(len, "a read")?;
                self.allocated += 1;
                return Ok(buf);
            }
            // Fewer than `depth` reads are in flight (see `read`), so the
            // hasher holds at least one buffer to give back.
            None => self
                .inner
                .reclaim_wait()
                .ok_or_else(|| io::Error::other("the hasher holds no buffer to give back"))?,
        };
        if buf.capacity() >= len {
            Ok(buf)
        } else {
            // The small one first: both at once may be more than there is.
            drop(buf);
            AlignedBuf::try_new(len, "a read")
        }
    }

    /// Buffers allocated at most under a bound in reads: those in flight,
    /// and those the hasher digests (as many again if it does not say).
    fn most_buffers(&self) -> usize {
        let busy = self.inner.busy_with().unwrap_or(self.depth);
        self.depth + busy.clamp(1, self.depth)
    }

    /// A buffer for a read of `len` bytes when reads are bounded by `m`
    /// bytes: reads vary in size (a qcow2 image's clusters), so buffers are
    /// counted by capacity, not number. A spare one is taken if it fits
    /// without wasting more than `len` (a 1 MiB buffer, every page of it
    /// touched once, would hold a 64 KiB read: 64 reads in flight would
    /// then hold 64 MiB); else a new one while every buffer together stays
    /// within `m` and as much again, up to [`WAITING`], for the reads
    /// waiting in the hasher and spare (the `2 × depth` buffers of a count
    /// bound, for reads of `m / depth` bytes), and within [`MOST_HELD`] or
    /// `m`; else the oldest read is passed on and its buffer awaited.
    fn buffer_within(&mut self, len: usize, m: usize) -> io::Result<AlignedBuf> {
        let cap = len.max(1).next_multiple_of(crate::buffer::ALIGN);
        let bound = (m + m.min(WAITING)).min(m.max(MOST_HELD));
        let fits = |b: &AlignedBuf| b.capacity() >= len && b.capacity() <= 2 * cap;
        loop {
            while let Some(b) = self.inner.reclaim() {
                self.spare.push(b);
            }
            if let Some(i) = (0..self.spare.len()).find(|&i| fits(&self.spare[i])) {
                return Ok(self.spare.swap_remove(i));
            }
            // The spares fit no read of this size: free them for a new one.
            while self.held + cap > bound
                && let Some(b) = self.spare.pop()
            {
                self.held = self.held.saturating_sub(b.capacity());
            }
            if self.held + cap <= bound || self.held == 0 {
                let buf = AlignedBuf::try_new(len, "a read")?;
                self.held += cap;
                return Ok(buf);
            }
            if !self.pending.is_empty() {
                self.pass_one()?;
                continue;
            }
            match self.inner.reclaim_wait() {
                Some(b) => self.spare.push(b),
                // Nothing to wait for: over the bound rather than stuck.
                None => {
                    let buf = AlignedBuf::try_new(len, "a read")?;
                    self.held += cap;
                    return Ok(buf);
                }
            }
        }
    }

    /// Pass the oldest pending item on to the sink, waiting for its read.
    fn pass_one(&mut self) -> io::Result<()> {
        match self.pending.pop_front() {
            Some(Pending::Read(rx, len)) => {
                self.reads -= 1;
                self.bytes -= len;
                let buf = rx
                    .recv()
                    .map_err(|_| io::Error::other("a reading thread stopped"))??;
                self.inner.data(buf)
            }
            Some(Pending::Zeros(len)) => self.inner.zeros(len),
            None => Ok(()),
        }
    }

    /// Wait for every read started and pass everything on, in order.
    pub fn flush(&mut self) -> io::Result<()> {
        while !self.pending.is_empty() {
            self.pass_one()?;
        }
        Ok(())
    }
}

impl Sink for ReadAhead<'_> {
    fn read(&mut self, len: usize, fill: Fill) -> io::Result<()> {
        let over = |a: &Self| {
            a.max_bytes
                .is_some_and(|m| a.reads > 0 && a.bytes + len > m)
        };
        while self.reads >= self.depth || over(self) {
            self.pass_one()?;
        }
        let buf = self.buffer(len)?;
        let (done, rx) = mpsc::sync_channel(1);
        let job = Job {
            buf,
            len,
            fill,
            done,
        };
        self.jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(|| io::Error::other("the reading threads stopped"))?;
        self.pending.push_back(Pending::Read(rx, len));
        self.reads += 1;
        self.bytes += len;
        Ok(())
    }

    fn data(&mut self, buf: AlignedBuf) -> io::Result<()> {
        self.flush()?;
        self.inner.data(buf)
    }

    fn zeros(&mut self, len: u64) -> io::Result<()> {
        if self.pending.is_empty() {
            self.inner.zeros(len)
        } else {
            self.pending.push_back(Pending::Zeros(len));
            Ok(())
        }
    }

    fn reclaim(&mut self) -> Option<AlignedBuf> {
        self.spare.pop().or_else(|| self.inner.reclaim())
    }

    fn reclaim_wait(&mut self) -> Option<AlignedBuf> {
        self.reclaim().or_else(|| self.inner.reclaim_wait())
    }
}

impl Drop for ReadAhead<'_> {
    fn drop(&mut self) {
        // Skip the queued reads; the ones running finish (the scope joins
        // their threads) and their results are dropped unread.
        self.stop.store(true, Ordering::Relaxed);
        self.jobs = None;
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink that keeps the last `keep` buffers it was given (as a hasher's
    /// queue does) and gives the older ones back.
    struct Keeps {
        keep: usize,
        /// What it says it keeps busy ([`Sink::busy_with`]).
        busy: Option<usize>,
        held: VecDeque<AlignedBuf>,
        back: Vec<AlignedBuf>,
    }

    impl Sink for Keeps {
        fn read(&mut self, _: usize, _: Fill) -> io::Result<()> {
            unreachable!("ReadAhead runs reads itself")
        }
        fn data(&mut self, buf: AlignedBuf) -> io::Result<()> {
            let fair = 2 * buf.len().next_multiple_of(crate::buffer::ALIGN);
            assert!(
                buf.capacity() <= fair,
                "a {}-byte read in a {}-byte buffer",
                buf.len(),
                buf.capacity()
            );
            self.held.push_back(buf);
            while self.held.len() > self.keep {
                self.back.extend(self.held.pop_front());
            }
            Ok(())
        }
        fn zeros(&mut self, _: u64) -> io::Result<()> {
            Ok(())
        }
        fn busy_with(&self) -> Option<usize> {
            self.busy
        }
        fn reclaim(&mut self) -> Option<AlignedBuf> {
            self.back.pop()
        }
        fn reclaim_wait(&mut self) -> Option<AlignedBuf> {
            self.back.pop().or_else(|| self.held.pop_front())
        }
    }

    /// Reads of mixed sizes under a bound in bytes: the buffers together
    /// stay within twice the bound (plus one read), however many
    /// small reads are in flight, and never a large buffer for a small read.
    #[test]
    fn buffers_of_mixed_reads_stay_within_the_bound() {
        let bound = 4 << 20;
        let mut sink = Keeps {
            keep: 16,
            busy: None,
            held: VecDeque::new(),
            back: Vec::new(),
        };
        std::thread::scope(|scope| {
            let mut ahead = ReadAhead::with_bytes(scope, &mut sink, 64, 1 << 20, bound).unwrap();
            for i in 0..2000u64 {
                // About one read in four large, at no regular interval.
                let len = if (i * 2_654_435_761u64) >> 30 & 3 == 0 {
                    1 << 20
                } else {
                    64 << 10
                };
                ahead
                    .read(
                        len,
                        Box::new(|b: &mut [u8]| {
                            b.fill(7);
                            Ok(())
                        }),
                    )
                    .unwrap();
                assert!(
                    ahead.held <= 2 * bound + (1 << 20),
                    "{} bytes held",
                    ahead.held
                );
                assert!(ahead.bytes <= bound + (1 << 20));
            }
            ahead.flush().unwrap();
        });
    }

    /// The most bytes of buffers held while 300 reads of 1 MiB run under
    /// a bound of `bound` bytes, in front of a sink that keeps 2 buffers
    /// busy and would queue 64.
    fn most_held_under(bound: usize) -> usize {
        let mut sink = Keeps {
            keep: 64,
            busy: Some(2),
            held: VecDeque::new(),
            back: Vec::new(),
        };
        std::thread::scope(|scope| {
            let mut ahead = ReadAhead::with_bytes(scope, &mut sink, 64, 1 << 20, bound).unwrap();
            let mut most = 0;
            for _ in 0..300 {
                let fill = Box::new(|b: &mut [u8]| {
                    b.fill(7);
                    Ok(())
                });
                ahead.read(1 << 20, fill).unwrap();
                most = most.max(ahead.held);
            }
            ahead.flush().unwrap();
            most
        })
    }

    /// Under a bound in bytes larger than 16 MiB the buffers are the bound
    /// and 16 MiB waiting for it, not twice the bound.
    #[test]
    fn buffers_under_a_large_bound_in_bytes_wait_16_mib_at_most() {
        let bound = 32 << 20;
        assert_eq!(most_held_under(bound), bound + (16 << 20));
    }

    /// Under a bound of 64 MiB the buffers hold 64 MiB in all: the reads
    /// in flight and those waiting share it.
    #[test]
    fn buffers_under_the_largest_bound_hold_it_in_all() {
        let bound = 64 << 20;
        assert_eq!(most_held_under(bound), bound);
    }

    /// Reads bounded by count in front of a sink that says it keeps 2
    /// buffers busy (and would queue every buffer it is given): 4 reads in
    /// flight take at most 6 buffers, not 8.
    #[test]
    fn buffers_are_the_reads_and_what_the_sink_keeps_busy() {
        let mut sink = Keeps {
            keep: 100,
            busy: Some(2),
            held: VecDeque::new(),
            back: Vec::new(),
        };
        std::thread::scope(|scope| {
            let mut ahead = ReadAhead::new(scope, &mut sink, 4, 1 << 20).unwrap();
            for _ in 0..200 {
                let fill = Box::new(|b: &mut [u8]| {
                    b.fill(7);
                    Ok(())
                });
                ahead.read(1 << 20, fill).unwrap();
                assert!(ahead.allocated <= 6, "{} buffers", ahead.allocated);
            }
            ahead.flush().unwrap();
            assert_eq!(ahead.allocated, 6);
        });
    }
}
