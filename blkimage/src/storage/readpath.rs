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
//! measures both: its lends are taken in rounds of [`ROUND`], the first
//! [`FIRST`] rounds alternately mapped and copied, and each lend's cost is
//! the CPU time of the thread that read and digested it
//! (`CLOCK_THREAD_CPUTIME_ID`: what other processes take of the CPUs does
//! not count, as wall time would on a busy machine), per byte, averaged per
//! way. After them every lend takes the cheaper way, but for one round in
//! [`PROBE_EVERY`] that takes the other, so that a change (the cache
//! evicted, another load on the memory bus) turns the choice. The probes
//! cost a sixteenth of the difference between the two ways, and nothing
//! while they cost the same.

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
/// more.
pub(crate) const PROBE_EVERY: u64 = 16;

/// The choice for one file, shared by the workers that read it.
#[derive(Debug)]
pub(crate) struct Chooser {
    how: MapReads,
    /// Lends begun.
    lends: AtomicU64,
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
            lends: AtomicU64::new(0),
            cost: [AtomicU64::new(0), AtomicU64::new(0)],
            mapped: AtomicU64::new(0),
        }
    }

    /// True if lends may be mapped at all.
    pub(crate) fn maps(&self) -> bool {
        self.how != MapReads::Never
    }

    /// The way of the next lend, and whether its cost is to be measured.
    pub(crate) fn next(&self) -> (Way, bool) {
        match self.how {
            MapReads::Never => (Way::Copied, false),
            MapReads::Always => (Way::Mapped, false),
            MapReads::Auto => {
                let round = self.lends.fetch_add(1, Ordering::Relaxed) / ROUND;
                if round < FIRST {
                    let way = if round.is_multiple_of(2) {
                        Way::Mapped
                    } else {
                        Way::Copied
                    };
                    return (way, true);
                }
                let cheaper = self.cheaper();
                match round.is_multiple_of(PROBE_EVERY) {
                    true => (cheaper.other(), true),
                    false => (cheaper, true),
                }
            }
        }
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

    fn ways(c: &Chooser, n: u64) -> Vec<Way> {
        (0..n).map(|_| c.next().0).collect()
    }

    #[test]
    fn fixed_choices_never_measure() {
        assert_eq!(Chooser::new(MapReads::Always).next(), (Way::Mapped, false));
        assert_eq!(Chooser::new(MapReads::Never).next(), (Way::Copied, false));
        assert!(!Chooser::new(MapReads::Never).maps());
    }

    #[test]
    fn the_first_rounds_alternate_then_the_cheaper_way_wins() {
        let c = Chooser::new(MapReads::Auto);
        let first = ways(&c, FIRST * ROUND);
        for (i, w) in first.iter().enumerate() {
            let want = [Way::Mapped, Way::Copied][(i as u64 / ROUND % 2) as usize];
            assert_eq!(*w, want, "lend {i}");
        }
        // Copies measured at 0.7x the maps' cost.
        for _ in 0..8 {
            c.record(Way::Mapped, 1000, 1 << 20);
            c.record(Way::Copied, 700, 1 << 20);
        }
        assert_eq!(c.cheaper(), Way::Copied);
        let later = ways(&c, PROBE_EVERY * ROUND);
        let mapped = later.iter().filter(|w| **w == Way::Mapped).count() as u64;
        // One round in PROBE_EVERY probes the dearer way.
        assert_eq!(mapped, ROUND);
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
