//! The worker pool: threads that digest runs of blocks, in any order.
//!
//! Ordering is not the pool's business: each job carries a sequence number
//! and the hasher puts results back in order.

use crate::algorithm::Algorithm;
use crate::zero::is_zero;
use crossbeam_channel::{Receiver, Sender};
use std::thread::JoinHandle;

/// Bytes a job digests: an internal staging buffer or a caller's buffer.
pub(crate) enum JobBuf<B> {
    Internal(Vec<u8>),
    External(B),
}

impl<B: AsRef<[u8]>> JobBuf<B> {
    fn bytes(&self) -> &[u8] {
        match self {
            JobBuf::Internal(v) => v,
            JobBuf::External(b) => b.as_ref(),
        }
    }
}

/// Digest the blocks of `buf[start..end]`; the last block may be short.
pub(crate) struct Job<B> {
    pub seq: u64,
    pub buf: JobBuf<B>,
    pub start: usize,
    pub end: usize,
}

/// A finished job: its buffer back, one digest per block, and which blocks were all zeros.
pub(crate) struct Done<B> {
    pub seq: u64,
    pub buf: JobBuf<B>,
    pub digests: Vec<u8>,
    pub zero: Vec<bool>,
}

pub(crate) struct Pool<B> {
    jobs: Option<Sender<Job<B>>>,
    pub done: Receiver<Done<B>>,
    threads: Vec<JoinHandle<()>>,
}

impl<B: AsRef<[u8]> + Send + 'static> Pool<B> {
    pub fn new(threads: usize, alg: Algorithm, block_size: usize, zero_digest: Vec<u8>) -> Self {
        let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Job<B>>();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let threads = (0..threads)
            .map(|i| {
                let jobs = jobs_rx.clone();
                let done = done_tx.clone();
                let zero_digest = zero_digest.clone();
                std::thread::Builder::new()
                    .name(format!("blkhash-{i}"))
                    .spawn(move || worker(jobs, done, alg, block_size, &zero_digest))
                    .expect("cannot start a blkhash worker thread")
            })
            .collect();
        Pool {
            jobs: Some(jobs_tx),
            done: done_rx,
            threads,
        }
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
    alg: Algorithm,
    block_size: usize,
    zero_digest: &[u8],
) {
    let out_len = alg.output_len();
    for job in jobs {
        let data = &job.buf.bytes()[job.start..job.end];
        let blocks = data.len().div_ceil(block_size);
        let mut digests = vec![0u8; blocks * out_len];
        let mut zero = vec![false; blocks];
        if alg != Algorithm::Null {
            for ((block, out), z) in data
                .chunks(block_size)
                .zip(digests.chunks_exact_mut(out_len.max(1)))
                .zip(zero.iter_mut())
            {
                // Only a full block of zeros has the constant digest; a short
                // last block is digested as it is.
                if block.len() == block_size && is_zero(block) {
                    out.copy_from_slice(zero_digest);
                    *z = true;
                } else {
                    alg.digest_into(block, out);
                }
            }
        }
        let result = Done {
            seq: job.seq,
            buf: job.buf,
            digests,
            zero,
        };
        if done.send(result).is_err() {
            return;
        }
    }
}
