//! The worker pool: threads that digest runs of blocks, in any order.
//!
//! Ordering is not the pool's business: each job carries a sequence number
//! and the hasher puts results back in order.

use crate::algorithm::Algorithm;
use crate::options::{IN_FLIGHT_BUDGET, JobDone};
use crate::zero::is_zero;
use crossbeam_channel::{Receiver, Sender};
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Produces a job's bytes on a worker: fills the whole slice, or fails.
pub type Fill = Box<dyn FnOnce(&mut [u8]) -> io::Result<()> + Send>;

/// Lends a job's bytes where they already are (a memory map of a file) to
/// a worker, which digests them in place: calls its argument once with
/// exactly the job's bytes, then returns; an error if it cannot lend them,
/// or if the bytes it lent turned out not to be the source's (a mapping
/// cut short by a file that shrank). The digests of a failed lend never
/// join the checksum.
pub type Lend = Box<dyn FnOnce(&mut dyn FnMut(&[u8])) -> io::Result<()> + Send>;

/// Bytes a job digests: an internal staging buffer, a caller's buffer,
/// bytes a worker produces itself into its own buffer (a read, typically:
/// done on the core that digests them, they are still in its cache), or
/// bytes lent in place (a mapped file: no copy at all).
pub(crate) enum JobBuf<B> {
    Internal(Vec<u8>),
    External(B),
    Fill(Fill),
    Lend(Lend),
}

/// Digest the blocks of `buf[start..end]`; the last block may be short.
pub(crate) struct Job<B> {
    pub seq: u64,
    pub buf: JobBuf<B>,
    pub start: usize,
    pub end: usize,
}

/// A finished job: its buffer back (none for a fill), one digest per block,
/// which blocks were all zeros, or the fill's error.
pub(crate) struct Done<B> {
    pub seq: u64,
    pub buf: Option<JobBuf<B>>,
    pub digests: Vec<u8>,
    pub zero: Vec<bool>,
    pub error: Option<io::Error>,
}

pub(crate) struct Pool<B> {
    jobs: Option<Sender<Job<B>>>,
    pub done: Receiver<Done<B>>,
    threads: Vec<JoinHandle<()>>,
}

impl<B: AsRef<[u8]> + Send + 'static> Pool<B> {
    pub fn new(
        threads: usize,
        (alg, key): (Algorithm, Arc<[u8]>),
        block_size: usize,
        zero_digest: Vec<u8>,
        job_done: Option<JobDone>,
    ) -> io::Result<Self> {
        let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Job<B>>();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let mut pool = Pool {
            jobs: Some(jobs_tx),
            done: done_rx,
            threads: Vec::with_capacity(threads),
        };
        // Each worker keeps its fill buffer for the next job if all of them
        // together fit in the budget (1 MiB reads: up to 256 workers), else
        // frees it after each job: then only the fills in flight hold one.
        let keep = IN_FLIGHT_BUDGET / threads.max(1);
        for i in 0..threads {
            let jobs = jobs_rx.clone();
            let done = done_tx.clone();
            let zero_digest = zero_digest.clone();
            let job_done = job_done.clone();
            let key = key.clone();
            // A thread the system will not start (a limit on threads or
            // memory) is the caller's error to report; returning drops the
            // pool, which stops and joins the workers already started.
            // Awaited until it runs: what the system maps for a thread as
            // it starts is then mapped before the next one takes the room
            // (see room_for_thread).
            let (started, running) = crossbeam_channel::bounded::<()>(0);
            let room = crate::room_for_thread()?;
            let t = std::thread::Builder::new()
                .name(format!("blkhash-{i}"))
                .spawn(move || {
                    drop(started);
                    let digest = BlockDigest {
                        alg,
                        key: &key,
                        block_size,
                        zero_digest: &zero_digest,
                    };
                    worker(jobs, done, job_done, digest, keep)
                })?;
            pool.threads.push(t);
            let _ = running.recv();
            drop(room);
        }
        Ok(pool)
    }

    pub fn send(&self, job: Job<B>) {
        // Workers only exit when the sender is dropped, so this cannot fail
        // unless a worker panicked, which is a bug worth a panic here too.
        self.jobs
            .as_ref()
            .unwrap()
            .send(job)
            .expect("blkhash worker died");
    }
}

impl<B> Drop for Pool<B> {
    fn drop(&mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn worker<B: AsRef<[u8]>>(
    jobs: Receiver<Job<B>>,
    done: Sender<Done<B>>,
    job_done: Option<JobDone>,
    how: BlockDigest<'_>,
    keep: usize,
) {
    let mut scratch = Scratch::default();
    for Job {
        seq,
        buf,
        start,
        end,
    } in jobs
    {
        let digest = |data: &[u8]| digest_blocks(data, &how);
        // A panic (a bug, or a caller's fill that panics) must become this
        // job's error: left to unwind, it would end this worker while the
        // others keep the done channel open, and the caller would wait forever.
        let work = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match buf {
            JobBuf::Fill(fill) => {
                let r = scratch
                    .get(end - start)
                    .and_then(|data| fill(data).and_then(|()| digest(data)));
                scratch.trim(keep);
                (None, r)
            }
            JobBuf::Lend(lend) => {
                let want = end - start;
                let mut out = None;
                let lent = lend(&mut |data: &[u8]| {
                    if data.len() == want {
                        out = Some(digest(data));
                    }
                });
                let r = lent.and_then(|()| {
                    out.unwrap_or_else(|| {
                        Err(io::Error::other(format!(
                            "lent bytes were not {want} bytes"
                        )))
                    })
                });
                (None, r)
            }
            JobBuf::Internal(v) => {
                let r = digest(&v[start..end]);
                (Some(JobBuf::Internal(v)), r)
            }
            JobBuf::External(b) => {
                let r = digest(&b.as_ref()[start..end]);
                (Some(JobBuf::External(b)), r)
            }
        }));
        let (buf, result) =
            work.unwrap_or_else(|_| (None, Err(io::Error::other("a blkhash worker panicked"))));
        let (digests, zero, error) = match result {
            Ok((digests, zero)) => (digests, zero, None),
            Err(e) => (Vec::new(), Vec::new(), Some(e)),
        };
        let done_job = Done {
            seq,
            buf,
            digests,
            zero,
            error,
        };
        if done.send(done_job).is_err() {
            return;
        }
        if let Some(f) = &job_done {
            (f.0)();
        }
    }
}

/// How a worker digests blocks: the digest, its key (empty: none), the
/// block size, and the constant of a full block of zeros.
struct BlockDigest<'a> {
    alg: Algorithm,
    key: &'a [u8],
    block_size: usize,
    zero_digest: &'a [u8],
}

/// Digest every block of `data` (the last may be short): the digests, and
/// which blocks were all zeros. An error if their memory cannot be had (a
/// large read of small blocks: 16 MiB of 4 KiB blocks takes 256 KiB of
/// SHA-512 digests).
fn digest_blocks(data: &[u8], how: &BlockDigest<'_>) -> io::Result<(Vec<u8>, Vec<bool>)> {
    let (alg, block_size, key) = (how.alg, how.block_size, how.key);
    let out_len = alg.output_len();
    let blocks = data.len().div_ceil(block_size);
    let mut digests = crate::try_zeroed(blocks * out_len, "block digests")?;
    let mut zero = Vec::new();
    zero.try_reserve_exact(blocks)
        .map_err(|_| crate::out_of_memory(blocks, "zero block flags"))?;
    zero.resize(blocks, false);
    if out_len == 0 {
        // The null digest measures reading: nothing to digest, no zero scan.
        return Ok((digests, zero));
    }
    // Zero blocks take the constant; the rest are digested together so a
    // multi-buffer digest (SHA-256) can interleave them.
    let mut data_blocks: Vec<&[u8]> = Vec::new();
    data_blocks
        .try_reserve_exact(blocks)
        .map_err(|_| crate::out_of_memory(blocks * size_of::<&[u8]>(), "block slices"))?;
    for (block, z) in data.chunks(block_size).zip(zero.iter_mut()) {
        // Only a full block of zeros has the constant digest; a short
        // last block is digested as it is.
        if block.len() == block_size && is_zero(block) {
            *z = true;
        } else {
            data_blocks.push(block);
        }
    }
    if data_blocks.len() == blocks {
        alg.digest_many_keyed(&data_blocks, key, &mut digests);
        return Ok((digests, zero));
    }
    let mut data_digests = crate::try_zeroed(data_blocks.len() * out_len, "block digests")?;
    alg.digest_many_keyed(&data_blocks, key, &mut data_digests);
    let mut next = data_digests.chunks_exact(out_len);
    for (out, z) in digests.chunks_exact_mut(out_len).zip(&zero) {
        if *z {
            out.copy_from_slice(how.zero_digest);
        } else if let Some(d) = next.next() {
            out.copy_from_slice(d);
        }
    }
    Ok((digests, zero))
}

/// A worker's own buffer for fills, page-aligned so direct I/O can read
/// into it, reused from job to job (it stays in the core's cache).
#[derive(Default)]
struct Scratch {
    mem: Vec<u8>,
}

impl Scratch {
    const ALIGN: usize = 4096;

    fn get(&mut self, len: usize) -> io::Result<&mut [u8]> {
        if self.mem.len() < len + Self::ALIGN {
            // The old one first: both at once may be more than there is.
            self.mem = Vec::new();
            self.mem = crate::try_zeroed(len + Self::ALIGN, "a worker's read buffer")?;
        }
        let off = self.mem.as_ptr().align_offset(Self::ALIGN);
        Ok(&mut self.mem[off..off + len])
    }

    /// Free the buffer if it holds more than `keep` bytes of data.
    fn trim(&mut self, keep: usize) {
        if self.mem.len() > keep + Self::ALIGN {
            self.mem = Vec::new();
        }
    }
}
