//! Whether a file read through the page cache is digested in place from
//! memory maps or copied: whichever costs less, measured as it is read.
//!
//! Neither way wins everywhere. A copy (`pread`) is a memory copy by the
//! kernel, and the digest then reads the copy from the core's cache; a map
//! costs filling and tearing down page tables (each unmap flushes the TLBs
//! of every core the process runs on: in a VM, interrupts between virtual
//! CPUs) and the digest reads the cached pages from memory. On the Intel
//! Xeon VM of `docs/performance.md` (machine D) maps took 0.72-0.88x the
//! time of copies; on the AMD EPYC VM (machine C) copies took 0.68x the
//! time of maps. So a file whose ranges may be mapped ([`MapReads::Auto`])
//! measures both. The reader asks for its ranges in order
//! ([`Chooser::plan`]), in rounds of [`ROUND`]: the first [`FIRST`] rounds
//! are lent alternately mapped and copied (a copy into a buffer of the
//! worker's, then digested), and each lend's cost is the CPU time of the
//! thread that read and digested it (`CLOCK_THREAD_CPUTIME_ID`: what other
//! processes take of the CPUs does not count, as wall time would on a busy
//! machine), per byte, averaged per way. After them every range takes the
//! cheaper way, copies as the reader's plain reads of the read size (as
//! `--no-mmap` reads: a smaller copy stays in the core's cache for the
//! digest), but for one round in [`PROBE_EVERY`] (or [`PROBE_RARELY`] when
//! one way costs a quarter more) lent the other way, so that a change (the
//! cache evicted, another load on the memory bus) turns the choice; while
//! copies are chosen, the round after each probe is copied as timed lends,
//! to keep their cost current.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Whether files read through the page cache are read from memory maps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MapReads {
    /// Always copied (`pread`); no SIGBUS handler. A library inside a host
    /// program that owns its signals keeps to this.
    #[default]
    Never,
    /// Mapped or copied, whichever is measured to cost less on this file
    /// (see [`crate::mapped`] for the handler this installs): the commands'
    /// default.
    Auto,
    /// Always mapped, where a range is large enough to be worth a map.
    Always,
}

/// How a lend's bytes reach the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Way {
    Mapped = 0,
    Copied = 1,
}

impl Way {
    fn other(self) -> Way {
        match self {
            Way::Mapped => Way::Copied,
            Way::Copied => Way::Mapped,
        }
    }
}

/// Lends per round: on a few cores, lends that run at once mostly take the
/// same way, so neither way's cost includes the other's disturbance (an
/// unmap interrupts the other cores).
pub(crate) const ROUND: u64 = 4;
/// Rounds at the start taken alternately mapped and copied (with 2 MiB
/// lends, 16 MiB each way).
pub(crate) const FIRST: u64 = 4;
/// After the first rounds, one round in this many takes the way that costs
/// more, while the two cost within a quarter of each other (a probe then
/// costs at most a quarter of a round or two in 16)...
pub(crate) const PROBE_EVERY: u64 = 16;
/// ... and one in this many when one way costs more (a probe round maps
/// 8 MiB where copies go 4 MiB a round: at machine C's 1.46x, 1.4% of the
/// time).
pub(crate) const PROBE_RARELY: u64 = 64;
/// Ranges planned and not yet lent, at most (the lends in flight are far
/// fewer).
const MAX_PENDING: usize = 1024;
/// The least a file lends from a map: below it a copy costs less than
/// mapping, filling the page tables and unmapping.
pub(crate) const MIN_LEND: usize = 256 << 10;

/// How a range is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Lent to the worker that digests it, mapped or copied.
    Lend(Way),
    /// Copied by the reader's plain read, into the worker's own buffer.
    Read,
}

/// The choice for one file, shared by the workers that read it.
#[derive(Debug)]
pub(crate) struct Chooser {
    how: MapReads,
    /// Ranges planned.
    ranges: AtomicU64,
    /// The ways planned for lends not yet taken: (offset, way).
    pending: Mutex<Vec<(u64, Way)>>,
    /// Per way: the running average of CPU nanoseconds per MiB read and
    /// digested; 0 until measured.
    cost: [AtomicU64; 2],
    /// Bytes lent from maps, for reports.
    mapped: AtomicU64,
}

impl Chooser {
    pub(crate) fn new(how: MapReads) -> Chooser {
        Chooser {
            how,
            ranges: AtomicU64::new(0),
            pending: Mutex::new(Vec::new()),
            cost: [AtomicU64::new(0), AtomicU64::new(0)],
            mapped: AtomicU64::new(0),
        }
    }

    /// True if lends may be mapped at all.
    pub(crate) fn maps(&self) -> bool {
        self.how != MapReads::Never
    }

    /// True if lends are timed for the choice.
    pub(crate) fn measures(&self) -> bool {
        self.how == MapReads::Auto
    }

    /// How the next range of the file (from `offset`, at least [`MIN_LEND`]
    /// bytes: the reader asks in order) is read: as a lend of the way said
    /// (which [`Chooser::take`] then gives its lend), or as a plain read,
    /// which the reader then copies into a digest worker's buffer of the
    /// read size (`--read-size`, 1 MiB: the copies' way while copies cost
    /// less; a copy of a whole lend, 2 MiB, costs a few percent more).
    pub(crate) fn plan(&self, offset: u64) -> Plan {
        let way = match self.how {
            MapReads::Never => return Plan::Read,
            MapReads::Always => return Plan::Lend(Way::Mapped),
            MapReads::Auto => {
                let round = self.ranges.fetch_add(1, Ordering::Relaxed) / ROUND;
                let cheaper = self.cheaper();
                let every = if self.close() {
                    PROBE_EVERY
                } else {
                    PROBE_RARELY
                };
                match (round < FIRST, round % every, cheaper) {
                    (true, _, _) if round.is_multiple_of(2) => Way::Mapped,
                    (true, _, _) => Way::Copied,
                    (false, 0, _) => cheaper.other(),
                    // While copies cost less, one round after each probe
                    // is copied as lends, timed, so that their cost keeps
                    // up with the maps'.
                    (false, 1, Way::Copied) => Way::Copied,
                    (false, _, Way::Copied) => return Plan::Read,
                    (false, _, Way::Mapped) => Way::Mapped,
                }
            }
        };
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if pending.len() >= MAX_PENDING {
            // Ranges planned and never lent (a run stopped): forget them.
            pending.clear();
        }
        pending.push((offset, way));
        Plan::Lend(way)
    }

    /// The way [`Chooser::plan`] chose for the lend from `offset` (the
    /// cheaper way if it planned none there).
    pub(crate) fn take(&self, offset: u64) -> Way {
        if self.how == MapReads::Always {
            return Way::Mapped;
        }
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        match pending.iter().position(|(o, _)| *o == offset) {
            Some(i) => pending.swap_remove(i).1,
            None => self.cheaper(),
        }
    }

    /// True while the two ways' costs are within a quarter of each other
    /// (or one is not measured yet): then either may overtake the other,
    /// and probes come more often.
    fn close(&self) -> bool {
        let [m, c] = self.costs();
        m == 0 || c == 0 || m.max(c) < m.min(c) + m.min(c) / 4
    }

    /// The way measured to cost less so far (mapped while neither is
    /// measured, or they cost the same).
    pub(crate) fn cheaper(&self) -> Way {
        let [mapped, copied] = self.costs();
        if copied != 0 && (mapped == 0 || copied < mapped) {
            Way::Copied
        } else {
            Way::Mapped
        }
    }

    /// The averages per way, CPU nanoseconds per MiB (0: not measured).
    pub(crate) fn costs(&self) -> [u64; 2] {
        [0, 1].map(|i| self.cost[i].load(Ordering::Relaxed))
    }

    /// Add a lend of `bytes` that took `nanos` of its thread's CPU time the
    /// way `way` to that way's average (each new lend an eighth of it).
    pub(crate) fn record(&self, way: Way, nanos: u64, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let sample = (u128::from(nanos) << 20) / bytes as u128;
        let sample = u64::try_from(sample).unwrap_or(u64::MAX).max(1);
        let _ = self.cost[way as usize].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            Some(match old {
                0 => sample,
                _ => old - old / 8 + sample / 8,
            })
        });
    }

    /// Count `bytes` lent from a map.
    pub(crate) fn lent_mapped(&self, bytes: usize) {
        self.mapped.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Bytes lent from maps so far.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.mapped.load(Ordering::Relaxed)
    }
}

/// A copied lend's buffer this thread keeps for the next, up to this size
/// (a 2 MiB lend, or a read size up to 4 MiB); a larger one is freed after
/// its lend, as the digest workers' own read buffers are.
const KEEP: usize = 4 << 20;

/// Page-aligned, as the kernel copies fastest into.
const ALIGN: usize = 4096;

std::thread_local! {
    static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Call `f` with a buffer of `len` bytes of this thread's, kept from lend
/// to lend (it stays in the core's cache, and is allocated once); an
/// error if its memory cannot be had.
pub(crate) fn with_buffer<T>(
    len: usize,
    f: impl FnOnce(&mut [u8]) -> std::io::Result<T>,
) -> std::io::Result<T> {
    BUFFER.with(|cell| {
        // A lend that runs inside another's on this thread (none does)
        // would find it borrowed: it gets a buffer of its own.
        let Ok(mut mem) = cell.try_borrow_mut() else {
            return f(&mut blkhash::try_zeroed(len, "a copied read")?);
        };
        if mem.len() < len + ALIGN {
            // The old one first: both at once may be more than there is.
            *mem = Vec::new();
            *mem = blkhash::try_zeroed(len + ALIGN, "a copied read")?;
        }
        let off = mem.as_ptr().align_offset(ALIGN);
        let r = f(&mut mem[off..off + len]);
        if mem.len() > KEEP + ALIGN {
            *mem = Vec::new();
        }
        r
    })
}

/// The CPU time this thread has run, in nanoseconds (0 if the clock cannot
/// be read: the lend's cost is then not recorded).
pub(crate) fn thread_cpu_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plans of the next `n` ranges of 2 MiB (from `at`), each lend
    /// taken as a worker would.
    fn plans(c: &Chooser, at: u64, n: u64) -> Vec<Plan> {
        (at..at + n)
            .map(|i| {
                let p = c.plan(i << 21);
                if let Plan::Lend(way) = p {
                    assert_eq!(c.take(i << 21), way, "range {i}");
                }
                p
            })
            .collect()
    }

    fn count(plans: &[Plan], p: Plan) -> u64 {
        plans.iter().filter(|x| **x == p).count() as u64
    }

    #[test]
    fn fixed_choices_never_measure() {
        let always = Chooser::new(MapReads::Always);
        assert_eq!(always.plan(0), Plan::Lend(Way::Mapped));
        assert_eq!(always.take(0), Way::Mapped);
        assert!(!always.measures());
        assert_eq!(Chooser::new(MapReads::Never).plan(0), Plan::Read);
        assert!(!Chooser::new(MapReads::Never).maps());
    }

    #[test]
    fn the_first_rounds_alternate_then_the_cheaper_way_wins() {
        let c = Chooser::new(MapReads::Auto);
        let first = plans(&c, 0, FIRST * ROUND);
        for (i, p) in first.iter().enumerate() {
            let want = [Way::Mapped, Way::Copied][(i as u64 / ROUND % 2) as usize];
            assert_eq!(*p, Plan::Lend(want), "range {i}");
        }
        // Copies measured at 0.9x the maps' cost: close, probed often.
        for _ in 0..8 {
            c.record(Way::Mapped, 1000, 1 << 20);
            c.record(Way::Copied, 900, 1 << 20);
        }
        assert_eq!(c.cheaper(), Way::Copied);
        let n = PROBE_EVERY * ROUND;
        let later = plans(&c, FIRST * ROUND, n);
        // One round in PROBE_EVERY probes the maps, the next is copied as
        // lends (timed), the rest are plain reads.
        assert_eq!(count(&later, Plan::Lend(Way::Mapped)), ROUND);
        assert_eq!(count(&later, Plan::Lend(Way::Copied)), ROUND);
        assert_eq!(count(&later, Plan::Read), n - 2 * ROUND);
        // Maps at 1.5x the copies' cost: probed one round in PROBE_RARELY.
        for _ in 0..32 {
            c.record(Way::Mapped, 1500, 1 << 20);
            c.record(Way::Copied, 1000, 1 << 20);
        }
        let n = PROBE_RARELY * ROUND;
        let later = plans(&c, 1 << 20, n);
        assert_eq!(count(&later, Plan::Lend(Way::Mapped)), ROUND);
        // And the other way round: maps cheaper, copies probed.
        for _ in 0..32 {
            c.record(Way::Mapped, 600, 1 << 20);
        }
        let later = plans(&c, 2 << 20, n);
        assert_eq!(count(&later, Plan::Lend(Way::Copied)), ROUND);
        assert_eq!(count(&later, Plan::Lend(Way::Mapped)), n - ROUND);
    }

    #[test]
    fn a_lend_not_planned_takes_the_cheaper_way_and_stale_plans_are_dropped() {
        let c = Chooser::new(MapReads::Auto);
        c.record(Way::Mapped, 900, 1 << 20);
        c.record(Way::Copied, 700, 1 << 20);
        assert_eq!(c.take(12345), Way::Copied);
        for i in 0..3 * MAX_PENDING as u64 {
            let _ = c.plan(i);
        }
        assert!(c.pending.lock().unwrap().len() <= MAX_PENDING);
    }

    #[test]
    fn a_change_in_cost_turns_the_choice() {
        let c = Chooser::new(MapReads::Auto);
        c.record(Way::Mapped, 500, 1 << 20);
        c.record(Way::Copied, 700, 1 << 20);
        assert_eq!(c.cheaper(), Way::Mapped);
        // Maps get dearer (say the cache was evicted): within a few
        // probes the average follows.
        for _ in 0..8 {
            c.record(Way::Mapped, 1500, 1 << 20);
        }
        assert_eq!(c.cheaper(), Way::Copied);
        // Costs are per byte: a short lend counts as much per byte.
        let c = Chooser::new(MapReads::Auto);
        c.record(Way::Mapped, 1000, 2 << 20);
        c.record(Way::Copied, 600, 1 << 20);
        assert_eq!(c.costs(), [500, 600]);
    }

    #[test]
    fn the_thread_clock_runs() {
        let t0 = thread_cpu_nanos();
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(x);
        assert!(thread_cpu_nanos() > t0);
    }
}
