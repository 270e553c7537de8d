//! An update whose DST map is known (its state): each block of SRC is
//! compared with DST's as its digest joins the checksum, in block order, and
//! the blocks that differ are written by writer threads while the rest of
//! SRC is still being hashed. The update then takes about as long as
//! hashing SRC, not hashing and then copying (the Bvckup design: no
//! whole-file step on the critical path).
//!
//! The writers re-read the blocks that differ from SRC rather than taking
//! them from the digest workers: the workers' buffers are reused as soon as
//! a chunk is digested, and a copy kept for the writers would cost every
//! block a copy to save the few that changed a read.

use super::Error;
use super::copy::{Job, Op, Writer, op_buffer};
use super::known::Known;
use super::target::Target;
use blkhash::BlockEvent;
use blkmap::MapError;
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Where a [`Differ`] leaves the error that stopped it (the state could
/// not be read on): the run fails with it once the hashing is done.
pub type Failed = Arc<Mutex<Option<MapError>>>;

/// Turns SRC's block events into ops for the blocks where DST differs.
/// Owned by the hasher's observer; when the hasher is done it drops this,
/// which sends the last op and closes the writer's queue.
pub struct Differ {
    dst: Known,
    size: u64,
    block_size: u64,
    pending: Option<Job>,
    ops: Sender<Job>,
    failed: Failed,
    /// An error is in `failed`: nothing more is compared (a field of its
    /// own: the events ask on every block, the lock is for the caller).
    stopped: bool,
}

impl Differ {
    /// For a SRC of `size` bytes in blocks of `block_size`, and DST
    /// holding what `dst` says (and zeros past its end: a file grown to
    /// SRC's size reads as zeros); an error reading `dst` is left in
    /// `failed`, and no op is queued after it.
    pub fn new(
        dst: Known,
        size: u64,
        block_size: usize,
        failed: Failed,
    ) -> (Differ, Receiver<Job>) {
        let (ops, rx) = crossbeam_channel::unbounded();
        let d = Differ {
            dst,
            size,
            block_size: block_size as u64,
            pending: None,
            ops,
            failed,
            stopped: false,
        };
        (d, rx)
    }

    /// Keep `e`, the first error reading the state: nothing more is
    /// compared, and the op pending is dropped.
    fn fail(&mut self, e: MapError) {
        self.pending = None;
        self.stopped = true;
        let mut slot = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(e);
    }

    pub fn event(&mut self, e: BlockEvent<'_>) {
        if self.stopped {
            return;
        }
        match e {
            BlockEvent::Data { index, digest } => {
                let zero = digest == self.dst.zero_digest;
                let same = match self.dst.block(index) {
                    Ok(Some(d)) => d == digest,
                    Ok(None) => zero,
                    Err(e) => return self.fail(e),
                };
                if !same {
                    self.push(index, 1, zero);
                    if !zero && let Some(p) = &mut self.pending {
                        p.digests.extend_from_slice(digest);
                    }
                }
            }
            BlockEvent::Zeros { index, count } => {
                // DST's data blocks in the range become zeros; a run at a
                // time, so a TiB of zeros costs one look-up per DST run.
                let end = index + count;
                let mut at = index;
                while at < end {
                    let (run_end, data) = match self.dst.run_at(at) {
                        Ok(Some(run)) => run,
                        Ok(None) => break, // past DST's end: zeros already
                        Err(e) => return self.fail(e),
                    };
                    let run_end = run_end.min(end);
                    if data {
                        self.push(at, run_end - at, true);
                    }
                    at = run_end;
                }
            }
        }
    }

    /// Blocks `first..first + count` differ: extend the pending op, or
    /// queue it and start another (a data block is never split: its
    /// digest follows it).
    fn push(&mut self, first: u64, count: u64, zero: bool) {
        let max = Op::max_len(zero, self.block_size);
        let mut offset = first * self.block_size;
        let end = ((first + count) * self.block_size).min(self.size);
        while offset < end {
            if let Some(Job { op: p, .. }) = &mut self.pending
                && p.zero == zero
                && p.end() == offset
                && p.len < max
            {
                let n = (end - offset).min(max - p.len);
                p.len += n;
                offset += n;
                continue;
            }
            let len = (end - offset).min(max);
            let op = Op { offset, len, zero };
            let next = Job {
                op,
                digests: Vec::new(),
            };
            if let Some(p) = self.pending.replace(next) {
                self.send(p);
            }
            offset += len;
        }
    }

    fn send(&self, job: Job) {
        // A writer that stopped has failed and says why; nothing to add.
        let _ = self.ops.send(job);
    }
}

impl Drop for Differ {
    fn drop(&mut self) {
        if let Some(p) = self.pending.take() {
            self.send(p);
        }
    }
}

/// Pass on to `f` the part of the block event `e` that falls in the dirty
/// blocks `blocks` (in order, merged): an update read through a dirty
/// bitmap sees the clean blocks as holes, which say nothing of SRC.
pub fn dirty_only(
    blocks: &[std::ops::Range<u64>],
    e: BlockEvent<'_>,
    f: &mut dyn FnMut(BlockEvent<'_>),
) {
    match e {
        BlockEvent::Data { index, .. } => {
            let k = blocks.partition_point(|r| r.end <= index);
            if blocks.get(k).is_some_and(|r| r.start <= index) {
                f(e);
            }
        }
        BlockEvent::Zeros { index, count } => {
            let end = index + count;
            let k = blocks.partition_point(|r| r.end <= index);
            for r in blocks[k..].iter().take_while(|r| r.start < end) {
                let (a, b) = (r.start.max(index), r.end.min(end));
                if a < b {
                    f(BlockEvent::Zeros {
                        index: a,
                        count: b - a,
                    });
                }
            }
        }
    }
}

/// Writers applying ops at once: an NBD export takes requests in flight
/// (each write waits a round trip, so several hide the link's latency); a
/// file takes one (parallel writes to one file spin on its inode lock).
pub fn writers(dst: &Target) -> usize {
    match dst {
        Target::Nbd(_) => 4,
        Target::File(_) => 1,
    }
}

/// Apply the ops as they come, on `writers` threads, until the queue
/// closes; `before_first` runs once, before any op (it removes the state:
/// a state must never describe a DST being written). The first failure
/// stops every writer.
pub fn write_ops(
    ops: Receiver<Job>,
    w: &Writer<'_>,
    writers: usize,
    before_first: impl Fn() -> Result<(), Error> + Sync,
) -> Result<(), Error> {
    // Whether `before_first` succeeded; its error, kept for the end.
    let ready = OnceLock::new();
    let not_ready = Mutex::new(None);
    let failed = AtomicBool::new(false);
    let write = || {
        let mut buf = None;
        for job in &ops {
            if failed.load(Ordering::Relaxed) {
                continue; // drain: the run has failed
            }
            let ok = *ready.get_or_init(|| match before_first() {
                Ok(()) => true,
                Err(e) => {
                    *not_ready.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    false
                }
            });
            let done = match ok {
                true => job
                    .op
                    .apply(w, buf.get_or_insert_with(op_buffer), &job.digests),
                false => Ok(()), // reported once, below
            };
            if !ok || done.is_err() {
                failed.store(true, Ordering::Relaxed);
                return done;
            }
        }
        Ok(())
    };
    let written = std::thread::scope(|s| {
        // At the system's limit on threads, the writers that started write
        // everything; with none, this thread does.
        let threads: Vec<_> = (0..writers.max(1))
            .map_while(|_| std::thread::Builder::new().spawn_scoped(s, write).ok())
            .collect();
        if threads.is_empty() {
            return write();
        }
        threads
            .into_iter()
            .map(|t| t.join().expect("writer thread"))
            .fold(Ok(()), Result::and)
    });
    match not_ready.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => written,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_dirty_blocks_of_an_event_are_passed_on() {
        let blocks = [2..4, 6..7, 9..20];
        let mut seen = Vec::new();
        let mut pass = |e: BlockEvent<'_>| {
            seen.push(match e {
                BlockEvent::Data { index, .. } => (index, 0),
                BlockEvent::Zeros { index, count } => (index, count),
            })
        };
        for index in [1, 2, 3, 4, 6, 19, 20] {
            let digest = &[0u8; 4][..];
            dirty_only(&blocks, BlockEvent::Data { index, digest }, &mut pass);
        }
        let zeros = BlockEvent::Zeros {
            index: 0,
            count: 10,
        };
        dirty_only(&blocks, zeros, &mut pass);
        dirty_only(&blocks, BlockEvent::Zeros { index: 4, count: 2 }, &mut pass);
        assert_eq!(
            seen,
            [(2, 0), (3, 0), (6, 0), (19, 0), (2, 2), (6, 1), (9, 1)]
        );
    }
    use super::super::known::Known;
    use blkhash::{Hasher, Options};
    use blkmap::{Map, MapBuilder, MapReader};
    use proptest::prelude::*;

    const BS: usize = 4096;

    fn map(build: impl FnOnce(&mut Hasher)) -> Map {
        let mut h = Hasher::with_options(Options::new().block_size(BS)).unwrap();
        let b = MapBuilder::attach(&mut h).unwrap();
        build(&mut h);
        b.finalize(h).unwrap()
    }

    /// The ops a Differ queues for SRC (hashed by `src`) against `dst`.
    fn ops(dst: Map, size: u64, src: impl FnOnce(&mut Hasher)) -> Vec<Op> {
        let pieces = MapReader::new(std::io::Cursor::new(dst.to_bytes())).unwrap();
        let failed = Failed::default();
        let (differ, rx) = Differ::new(Known::new(Box::new(pieces)), size, BS, failed.clone());
        let differ = std::sync::Mutex::new(differ);
        let mut h = Hasher::with_options(Options::new().block_size(BS)).unwrap();
        h.set_observer(move |e| differ.lock().unwrap().event(e));
        src(&mut h);
        assert_eq!(h.len(), size);
        h.finalize();
        let ops = rx.iter().map(|j| j.op).collect();
        assert!(failed.lock().unwrap().is_none());
        ops
    }

    fn op(offset: usize, len: usize, zero: bool) -> Op {
        Op {
            offset: offset as u64,
            len: len as u64,
            zero,
        }
    }

    #[test]
    fn only_differing_blocks() {
        let dst = map(|h| {
            h.update([1u8; 4 * BS]);
            h.update_zeros(4 * BS as u64);
            h.update([2u8; 4 * BS]);
        });
        let got = ops(dst, 12 * BS as u64, |h| {
            h.update([1u8; 2 * BS]); // same
            h.update([9u8; 2 * BS]); // data changed
            h.update([0u8; BS]); // written zeros over a hole: same
            h.update([3u8; BS]); // data over a hole
            h.update_zeros(2 * BS as u64); // same
            h.update_zeros(BS as u64); // zeros over data
            h.update([2u8; 3 * BS]); // same
        });
        assert_eq!(
            got,
            [
                op(2 * BS, 2 * BS, false),
                op(5 * BS, BS, false),
                op(8 * BS, BS, true)
            ]
        );
    }

    #[test]
    fn grown_and_short_tail() {
        // DST: 2.5 blocks; SRC: 5 blocks, the new ones zeros but one.
        let dst = map(|h| h.update([1u8; 2 * BS + BS / 2]));
        let got = ops(dst, 5 * BS as u64 + 100, |h| {
            h.update([1u8; 2 * BS]);
            h.update([1u8; BS]); // DST's short block, now full
            h.update_zeros(BS as u64); // past DST's end: a hole already
            h.update([7u8; BS + 100]);
        });
        assert_eq!(got, [op(2 * BS, BS, false), op(4 * BS, BS + 100, false)]);
    }

    /// An image as pieces of whole blocks (0: known zeros, 1: written
    /// zeros, else data of that byte) and a short tail of data.
    fn image() -> impl Strategy<Value = (Vec<(usize, u8)>, usize)> {
        (
            prop::collection::vec((1usize..4, 0u8..5), 0..12),
            0usize..BS,
        )
    }

    fn feed(h: &mut Hasher, (pieces, tail): &(Vec<(usize, u8)>, usize)) -> Vec<u8> {
        let mut bytes = Vec::new();
        for &(blocks, kind) in pieces {
            let n = blocks * BS;
            match kind {
                0 => h.update_zeros(n as u64),
                1 => h.update(vec![0u8; n]),
                b => h.update(vec![b; n]),
            }
            bytes.resize(bytes.len() + n, if kind < 2 { 0 } else { kind });
        }
        h.update(vec![7u8; *tail]);
        bytes.resize(bytes.len() + tail, 7);
        bytes
    }

    proptest! {
        /// Any DST and SRC (sizes, data, written zeros, holes, short last
        /// blocks): DST's bytes with the ops applied are SRC's.
        #[test]
        fn ops_make_dst_equal_to_src(dst in image(), src in image()) {
            let mut dst_bytes = Vec::new();
            let dst_map = map(|h| dst_bytes = feed(h, &dst));
            let mut src_bytes = Vec::new();
            let size = {
                let mut h = Hasher::with_options(Options::new().block_size(BS)).unwrap();
                feed(&mut h, &src).len() as u64
            };
            let got = ops(dst_map, size, |h| src_bytes = feed(h, &src));
            // A file DST is resized to SRC's size first (grown with zeros).
            dst_bytes.resize(src_bytes.len(), 0);
            for op in got {
                let r = op.offset as usize..op.end() as usize;
                if op.zero {
                    dst_bytes[r].fill(0);
                } else {
                    dst_bytes[r.clone()].copy_from_slice(&src_bytes[r]);
                }
            }
            prop_assert_eq!(dst_bytes, src_bytes);
        }
    }

    #[test]
    fn long_runs_split_into_ops() {
        let blocks = 3 * super::super::copy::CHUNK as usize / BS;
        let dst = map(|h| h.update_zeros((blocks * BS) as u64));
        let got = ops(dst, (blocks * BS) as u64, |h| {
            h.update(vec![5u8; blocks * BS]);
        });
        let chunk = super::super::copy::CHUNK as usize;
        assert_eq!(
            got,
            [
                op(0, chunk, false),
                op(chunk, chunk, false),
                op(2 * chunk, chunk, false)
            ]
        );
        // Zeros over a large DST that is mostly zeros: only its data.
        let size = 1u64 << 36;
        let dst = map(|h| {
            h.update([1u8; BS]);
            h.update_zeros(size - 2 * BS as u64);
            h.update([1u8; BS]);
        });
        let got = ops(dst, size, |h| h.update_zeros(size));
        assert_eq!(got, [op(0, BS, true), op(size as usize - BS, BS, true)]);
    }
}
