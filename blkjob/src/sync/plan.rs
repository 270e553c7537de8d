//! How DST is brought up to date: the plan chosen from what is known of
//! DST, and one function to carry out each.

use super::copy::{self, CopyTarget, CopyThrough, Counts, Progress, WriteThrough, Writer};
use super::dst::{Dst, Kind, SharedNbd};
use super::known::Known;
use super::target::Target;
use super::{DryRun, Error, Request, update};
use crate::{Job, state};
use blkhash::BlockEvent;
use blkimage::{Input, ReadAhead, Sink, Source};
use blkmap::{Header, Map, MapBuilder, MapFile, MapLike, Part, Pending, Range};
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// What a run does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// DST holds only zeros (new, empty, no data allocated, an export
    /// that reads as zeros): SRC's data blocks are written as they are
    /// read, nothing is compared. `hash`: SRC is hashed on the way (a
    /// state to save, a checksum to print or verify); else it is a plain
    /// copy, as `qemu-img convert` does.
    FirstCopy {
        /// Whether SRC's map is made while it is copied.
        hash: bool,
    },
    /// DST's blocks are known from its state: each block of SRC is
    /// compared as it is hashed, and the ones that differ are written
    /// while the rest is still being hashed.
    Update,
    /// SRC is hashed, DST's blocks are taken from `DstBlocks`, then the
    /// ranges that differ are written (or, for a dry run, listed).
    Compare(DstBlocks),
}

/// Where a comparison takes DST's blocks from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DstBlocks {
    /// Its state (a dry run with a state that describes DST).
    State,
    /// Zeros: DST is known to hold nothing (a dry run).
    Zeros,
    /// DST, read and hashed alongside SRC.
    Read,
}

/// What is known of DST's blocks before anything is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DstKnown {
    /// A state that describes DST.
    State,
    /// DST holds only zeros (missing, new, or all holes).
    Empty,
    /// Nothing: DST must be read.
    Unknown,
}

impl Plan {
    /// The plan for a run: a dry run only compares; a state that
    /// describes DST makes an update; a DST known to hold only zeros
    /// makes a first copy (hashing SRC if `needs_src_map`); anything else
    /// is read and compared.
    pub fn choose(dry_run: bool, dst: DstKnown, needs_src_map: bool) -> Plan {
        match (dry_run, dst) {
            (false, DstKnown::State) => Plan::Update,
            (false, DstKnown::Empty) => Plan::FirstCopy {
                hash: needs_src_map,
            },
            (true, DstKnown::State) => Plan::Compare(DstBlocks::State),
            (true, DstKnown::Empty) => Plan::Compare(DstBlocks::Zeros),
            (_, DstKnown::Unknown) => Plan::Compare(DstBlocks::Read),
        }
    }

    /// Carry the plan out, then flush, verify and save the state as asked.
    pub(super) fn carry_out(self, mut c: Ctx<'_>) -> Result<Done, Error> {
        let (src_map, dst) = match self {
            Plan::FirstCopy { hash } => first_copy(&c, hash)?,
            Plan::Update => {
                let known = c.dst_map.take().expect("an update has DST's state");
                update(&c, &known)?
            }
            Plan::Compare(from) => match compare(&mut c, from)? {
                Compared::Written(map, dst) => (Some(map), dst),
                Compared::DryRun(done) => return Ok(done),
            },
        };
        finish(&c, src_map, dst)
    }
}

/// Where SRC's map is written as it is made (a first copy, an update):
/// memory stays bounded whatever its size.
pub(super) enum MapOut {
    /// Beside the state, renamed over it once DST is flushed.
    State(Pending),
    /// An unnamed temporary file: only the checksum is wanted.
    Temp(File),
}

impl MapOut {
    fn file(&self) -> &File {
        match self {
            MapOut::State(p) => p.file(),
            MapOut::Temp(f) => f,
        }
    }
}

/// SRC's map as a plan made it, written as it was made: its header, and
/// where.
pub(super) struct SrcMap(Header, MapOut);

/// What an update's hashing made: SRC's map, or (through a dirty bitmap)
/// the part of it the bitmap's blocks make, with where the state spliced
/// with it goes.
enum Fresh {
    Map(SrcMap),
    Part(Part, MapOut),
}

/// What a run shares between its steps.
pub(super) struct Ctx<'a> {
    pub req: &'a Request,
    pub src_name: &'a str,
    pub src: Arc<dyn Source>,
    pub job: &'a Job,
    pub dst: &'a Dst,
    /// DST's state, for an update (read where it lies).
    pub dst_map: Option<MapFile>,
    /// What SRC's dirty bitmap says changed since the state: an update
    /// reads only those blocks.
    pub changes: Option<crate::incremental::Changes>,
    /// What SRC read when the run started ([`crate::record`]): the state
    /// saved records it, for the next update through a dirty bitmap.
    pub src_record: Option<&'a crate::record::Record>,
    pub cancel: &'a AtomicBool,
    pub counts: &'a Arc<Counts>,
    pub progress: &'a dyn Progress,
}

/// What a plan leaves for the report.
pub(super) struct Done {
    /// SRC's map's header (its checksum), when a map was made.
    pub src_map: Option<Header>,
    pub would_write: Option<DryRun>,
}

impl Ctx<'_> {
    /// What copying ranges from SRC to `dst` needs.
    fn writer<'a>(&'a self, dst: &'a Target) -> Writer<'a> {
        Writer {
            src: &*self.src,
            src_name: self.src_name,
            dst,
            dst_name: &self.dst.name,
            counts: self.counts,
            progress: self.progress,
            cancel: self.cancel,
            check: (self.req.state.is_some() || self.req.checksum)
                .then_some((self.job.algorithm(), self.job.block_size() as u64)),
            key: self.job.digest_key(),
        }
    }

    /// Remove the state: it must never describe a DST being written.
    fn remove_state(&self) -> Result<(), Error> {
        let Some(p) = self.req.state_out() else {
            return Ok(());
        };
        let of_state = |e| Error::io(p.display(), e);
        state::remove(p).map_err(of_state)?;
        match self.req.index_state() {
            Some(index) => state::mark_from_index(p, index, self.src.size()).map_err(of_state),
            None => Ok(()),
        }
    }

    fn src_error(&self, e: io::Error) -> Error {
        Error::io(self.src_name, e)
    }

    /// Where SRC's map is written: beside the state, else (no state, a
    /// dry run) in an unnamed temporary file.
    fn map_out(&self) -> Result<MapOut, Error> {
        match (self.req.state_out(), self.req.dry_run) {
            (Some(p), false) => Pending::create(p)
                .map(MapOut::State)
                .map_err(|e| Error::io(p.display(), e)),
            _ => crate::temp_file("SRC's map")
                .map(MapOut::Temp)
                .map_err(|e| Error::io(self.src_name, e)),
        }
    }

    fn dst_error(&self, e: io::Error) -> Error {
        Error::io(&self.dst.name, e)
    }
}

/// Nothing to compare: every data block of SRC is written as soon as it
/// is read, on the worker that read it.
fn first_copy(c: &Ctx<'_>, hash: bool) -> Result<(Option<SrcMap>, Target), Error> {
    let size = c.src.size();
    c.remove_state()?;
    let out = match hash {
        true => Some(c.map_out()?),
        false => None,
    };
    let dst = Arc::new(c.dst.open_target()?);
    dst.set_len(size).map_err(|e| c.dst_error(e))?;
    let map = if let Some(out) = out {
        let failed = Arc::new(Mutex::new(None));
        let through = Through {
            dst: dst.clone(),
            name: Arc::from(c.dst.name.as_str()),
            failed: failed.clone(),
            flush_later: c.req.state_out().is_some(),
        };
        let map = hash_src_map(c, c.src.clone(), Some(through), |_| {}, out).map_err(|e| {
            // DST's failure first: it is why SRC's reading stopped.
            let failed = failed.lock().unwrap_or_else(|p| p.into_inner()).take();
            failed.unwrap_or_else(|| c.src_error(e))
        })?;
        Some(map)
    } else {
        copy_src(c, dst.clone())?;
        None
    };
    Ok((
        map,
        Arc::into_inner(dst).expect("workers are done with DST"),
    ))
}

/// DST's blocks are known from its state (read in order from its file as
/// SRC is hashed): the blocks that differ are written while SRC is
/// hashed, not after, and SRC's map is written as it is made (through a
/// dirty bitmap: the state's with the dirty blocks spliced in, in one
/// pass over the state once they are hashed).
fn update(c: &Ctx<'_>, known: &MapFile) -> Result<(Option<SrcMap>, Target), Error> {
    let size = c.src.size();
    let state_name = match &c.req.state {
        Some(p) => p.display().to_string(),
        None => "the state".to_string(),
    };
    let of_state = |e: blkmap::MapError| Error::io(&state_name, e.into());
    let out = c.map_out()?;
    let dst = c.dst.open_target()?;
    let resize = size != c.dst.size;
    if resize {
        c.remove_state()?;
        dst.set_len(size).map_err(|e| c.dst_error(e))?;
    }
    let failed = update::Failed::default();
    let block_size = c.job.block_size();
    let dst_blocks = compared(c, known).map_err(of_state)?;
    let (mut differ, ops) = update::Differ::new(dst_blocks, size, block_size, failed.clone());
    let w = c.writer(&dst);
    // With a dirty bitmap, only its blocks are read (the rest are holes to
    // the hasher, and not compared); the map is then the state's with them.
    let dirty = c.changes.as_ref().map(|ch| ch.blocks.clone());
    let watch = move |e: BlockEvent<'_>| match &dirty {
        Some(blocks) => update::dirty_only(blocks, e, &mut |e| differ.event(e)),
        None => differ.event(e),
    };
    // Through a bitmap, the map is written once the dirty blocks are
    // hashed, spliced into the state's.
    let masked = match &c.changes {
        Some(ch) => {
            let visible = ch.byte_ranges(block_size, size);
            let m = blkimage::Masked::new(c.src.clone(), visible).map_err(|e| c.src_error(e))?;
            Some(Arc::new(m) as Arc<dyn Source>)
        }
        None => None,
    };
    let (hashed, written) = std::thread::scope(|s| {
        // The hasher owns `watch`: once it is done, the writers' queue
        // closes and they end.
        let spawned = std::thread::Builder::new().spawn_scoped(s, || match masked {
            Some(m) => hash_src_part(c, m, watch).map(|part| Fresh::Part(part, out)),
            None => hash_src_map(c, c.src.clone(), None, watch, out).map(Fresh::Map),
        });
        let hasher = match spawned {
            Ok(h) => h,
            // The hashing must run beside the writes it feeds: at the
            // system's limit on threads, nothing is written.
            Err(e) => {
                let e = io::Error::new(e.kind(), format!("cannot start a hashing thread: {e}"));
                return (Err(e), Ok(()));
            }
        };
        let written = update::write_ops(ops, &w, update::writers(&dst), || match resize {
            true => Ok(()),
            false => c.remove_state(),
        });
        (hasher.join().expect("hashing thread"), written)
    });
    // DST's failure first: SRC's hashing goes on after it; then the
    // state's, which stopped the comparison.
    written?;
    if let Some(e) = failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(of_state(e));
    }
    let map = match hashed.map_err(|e| c.src_error(e))? {
        Fresh::Map(map) => map,
        Fresh::Part(fresh, out) => {
            let ranges = c.changes.as_ref().map_or(&[][..], |ch| &ch.blocks[..]);
            splice_state(c, known, &fresh, ranges, out).map_err(of_state)?
        }
    };
    Ok((Some(map), dst))
}

/// DST's blocks an update compares SRC's with, from its state `known`:
/// every block, or through a dirty bitmap the dirty ones. The state was
/// read whole and found intact when it was opened (state::open): they
/// are looked up in it, not read and checked again (through a bitmap,
/// only the dirty blocks' digests are read).
fn compared(c: &Ctx<'_>, known: &MapFile) -> Result<Known, blkmap::MapError> {
    let blocks = match &c.changes {
        Some(ch) => ch.blocks.clone(),
        None => std::iter::once(0..known.header().blocks()).collect(),
    };
    Ok(Known::looked_up(known.lookup()?, blocks, known.header()))
}

/// The state `known` with the blocks `ranges` of `fresh` (SRC's, read
/// through its dirty bitmap) spliced in, written where SRC's map goes:
/// one pass over the state. It was read whole and checked when it was
/// opened (state::open), which had to come first: whether it is intact
/// decides the plan, and a damaged one is refused before DST is touched,
/// long before the dirty blocks it is spliced with are known. So it is
/// not checked again (a SHA-256 of the file and a digest of its digests),
/// only found unwritten since. (A fixed index as the state was checked
/// whole as it was copied into the map read here.)
fn splice_state(
    c: &Ctx<'_>,
    known: &MapFile,
    fresh: &Part,
    ranges: &[std::ops::Range<u64>],
    out: MapOut,
) -> Result<SrcMap, blkmap::MapError> {
    let how = blkmap::Splice {
        fresh,
        ranges,
        compare: &[],
        identity: c.src_record.and_then(|r| r.identity()),
    };
    let old = known.pieces_known_intact()?;
    let (spliced, _) = blkmap::splice(old, how, out.file().try_clone()?)?;
    known.unchanged()?;
    Ok(SrcMap(spliced.header, out))
}

/// A comparison's outcome.
enum Compared {
    /// The differing ranges were written: SRC's map, and DST.
    Written(SrcMap, Target),
    /// A dry run: what would be written.
    DryRun(Done),
}

/// Both maps, each written to a file as it is made: SRC hashed; DST's
/// from its state, else zeros, else hashed (at the same time as SRC);
/// then the ranges that differ, found reading the two side by side,
/// written.
fn compare(c: &mut Ctx<'_>, from: DstBlocks) -> Result<Compared, Error> {
    let size = c.src.size();
    let known = c.dst_map.take();
    let c = &*c;
    let (src_map, dst_map) = std::thread::scope(|s| {
        // At the system's limit on threads, one after the other.
        let hs = std::thread::Builder::new().spawn_scoped(s, || hash_src_whole(c));
        let dst_map: io::Result<Box<dyn MapLike>> = match (from, known) {
            (DstBlocks::State, Some(m)) => Ok(Box::new(m)),
            (DstBlocks::Zeros, _) => zeros_map(c.job, c.dst.size).map(|m| Box::new(m) as _),
            _ => map_dst(c, c.cancel).map(|m| Box::new(m) as _),
        };
        let src_map = match hs {
            Ok(h) => h.join().expect("hashing thread"),
            Err(_) => hash_src_whole(c),
        };
        (src_map, dst_map)
    });
    let SrcMap(header, out) = src_map?;
    let dst_map = dst_map.map_err(|e| c.dst_error(e))?;
    let src_file = (out.file().try_clone())
        .and_then(|f| MapFile::from_file(f).map_err(io::Error::from))
        .map_err(|e| c.src_error(e))?;
    let todo = to_write(&src_file, &*dst_map, c.dst.size)?;
    drop(dst_map);
    if c.req.dry_run {
        let resize = (size != c.dst.size).then_some((c.dst.size, size));
        return Ok(Compared::DryRun(Done {
            src_map: Some(header),
            would_write: Some(DryRun {
                ranges: todo,
                resize,
            }),
        }));
    }
    if !todo.is_empty() || size != c.dst.size {
        c.remove_state()?;
    }
    let dst = c.dst.open_target()?;
    if c.dst.kind.is_file() && size != c.dst.size {
        dst.set_len(size).map_err(|e| c.dst_error(e))?;
    }
    let pieces = src_file.pieces_owned().map_err(|e| c.src_error(e.into()))?;
    copy::copy_ranges(&c.writer(&dst), &mut Known::new(pieces), &todo)?;
    Ok(Compared::Written(SrcMap(header, out), dst))
}

/// Hash SRC into its map, written where [`Ctx::map_out`] says.
fn hash_src_whole(c: &Ctx<'_>) -> Result<SrcMap, Error> {
    let out = c.map_out()?;
    hash_src_map(c, c.src.clone(), None, |_| {}, out).map_err(|e| c.src_error(e))
}

/// After any plan: DST flushed, verified and its state saved, as asked.
fn finish(c: &Ctx<'_>, src_map: Option<SrcMap>, dst: Target) -> Result<Done, Error> {
    // Flushed before a state describes it, even when nothing was written
    // (a run killed before may have left its writes in the page cache
    // only). Without a state there is nothing to keep true: like cp and
    // qemu-img convert, the writes are left to the page cache. An NBD
    // export is always flushed: once blksync is gone nobody would flush
    // the server's cache (qemu-nbd keeps qcow2 metadata there; killed,
    // it loses the writes).
    if c.req.state_out().is_some() || c.dst.kind == Kind::Nbd {
        dst.sync().map_err(|e| c.dst_error(e))?;
    }
    let header = src_map.as_ref().map(|SrcMap(h, _)| h.clone());
    if let (true, Some(h)) = (c.req.verify, &header) {
        let never = AtomicBool::new(false);
        let again = dst_checksum(c, &never).map_err(|e| c.dst_error(e))?;
        if again.is_none() || again != h.checksum {
            return Err(Error::VerifyFailed {
                dst: c.dst.name.clone(),
            });
        }
    }
    if let (Some(p), Some(src_map)) = (c.req.state_out(), src_map) {
        let file = match &dst {
            Target::File(f) => Some(f),
            Target::Nbd(_) => None,
        };
        let size = c.src.size();
        let saved = match src_map {
            SrcMap(h, MapOut::State(pending)) => pending.commit().and_then(|()| {
                let checksum = h.checksum.as_ref().ok_or_else(|| {
                    io::Error::other("SRC's map was written without its checksum")
                })?;
                state::save_side_of(p, checksum, file, &c.dst.path, size)
            }),
            SrcMap(_, MapOut::Temp(_)) => Err(io::Error::other(
                "SRC's map was not written beside the state",
            )),
        };
        saved.map_err(|e| Error::io(p.display(), e))?;
    }
    Ok(Done {
        src_map: header,
        would_write: None,
    })
}

/// Where SRC's chunks go besides the hasher, when DST is written on the fly.
struct Through {
    dst: Arc<Target>,
    name: Arc<str>,
    failed: Arc<Mutex<Option<Error>>>,
    flush_later: bool,
}

/// Hash `src` (SRC, or a view of it) into its map, written to `out` as it
/// is made, counting what is compared; with `through`, each chunk is also
/// written to DST. `watch` sees every block event.
fn hash_src_map(
    c: &Ctx<'_>,
    src: Arc<dyn Source>,
    through: Option<Through>,
    watch: impl FnMut(BlockEvent<'_>) + Send + 'static,
    out: MapOut,
) -> io::Result<SrcMap> {
    let file = Box::new(out.file().try_clone()?);
    let identity = c.src_record.and_then(|r| r.identity());
    let builder =
        MapBuilder::writing(c.job.algorithm(), c.job.block_size(), file, false, identity)?
            .block_key(c.job.digest_key());
    let mut h = observed(c, &builder, watch)?;
    read_src(c, &src, through, &mut h)?;
    let header = builder.finalize_written(h)?.header;
    // Only now are all reads done: is SRC still what we read?
    src.finish()?;
    Ok(SrcMap(header, out))
}

/// [`hash_src_map`] kept as a part in memory: the blocks read through a
/// dirty bitmap (`src` masks the rest, holes to the hasher).
fn hash_src_part(
    c: &Ctx<'_>,
    src: Arc<dyn Source>,
    watch: impl FnMut(BlockEvent<'_>) + Send + 'static,
) -> io::Result<Part> {
    let builder =
        MapBuilder::new(c.job.algorithm(), c.job.block_size())?.block_key(c.job.digest_key());
    let mut h = observed(c, &builder, watch)?;
    read_src(c, &src, None, &mut h)?;
    let part = builder.finalize_part(h, src.size(), 0)?;
    src.finish()?;
    Ok(part)
}

/// A hasher whose block events go to `watch`, then to `builder`.
fn observed(
    c: &Ctx<'_>,
    builder: &MapBuilder,
    mut watch: impl FnMut(BlockEvent<'_>) + Send + 'static,
) -> io::Result<blkhash::Pipeline<blkimage::AlignedBuf>> {
    let mut h = blkhash::Pipeline::new(c.job.hasher_options())?;
    let mut build = builder.observer();
    h.set_observer(move |e| {
        watch(e);
        build(e);
    });
    Ok(h)
}

/// Read `src` into the hasher `h`, counting what is compared; with
/// `through`, each chunk is also written to DST.
fn read_src(
    c: &Ctx<'_>,
    src: &Arc<dyn Source>,
    through: Option<Through>,
    h: &mut blkhash::Pipeline<blkimage::AlignedBuf>,
) -> io::Result<()> {
    let read_size = c.job.read_size();
    let mut on_read = |n: u64| {
        c.counts.compared.fetch_add(n, Ordering::Relaxed);
        c.progress.update(c.counts);
    };
    match through {
        // The reading threads go between the writes and the hasher: each
        // chunk is read and written on one of them.
        Some(t) => std::thread::scope(|scope| {
            let depth = write_depth(c, read_size);
            let mut ahead = None;
            let hasher: &mut dyn Sink = match depth {
                0 => h,
                d => ahead.insert(ReadAhead::new(scope, &mut *h, d, read_size)?),
            };
            let mut sink = WriteThrough {
                hasher,
                dst: t.dst,
                dst_name: t.name,
                block_size: c.job.block_size(),
                counts: c.counts.clone(),
                failed: t.failed,
                pos: 0,
                flush_later: t.flush_later,
            };
            blkimage::read_image(
                src.clone(),
                &mut sink,
                read_size,
                Some(0),
                c.cancel,
                &mut on_read,
            )?;
            ahead.map_or(Ok(()), |mut a| a.flush())
        })?,
        None => {
            let depth = c.job.io_depth();
            blkimage::read_image(src.clone(), h, read_size, depth, c.cancel, &mut on_read)?;
        }
    }
    Ok(())
}

/// DST, to be read and hashed: its raw bytes through the page cache (it
/// is written through it too), or the export through the connection
/// blksync writes with (a server may take one client only).
fn dst_input(c: &Ctx<'_>) -> io::Result<Input> {
    let raw = blkimage::OpenOptions {
        cache: true,
        format: Some(blkimage::Format::Raw),
        ..Default::default()
    };
    match &c.dst.nbd {
        Some(n) => Ok(Input::Image(Box::new(SharedNbd(n.clone())))),
        None => blkimage::open(&c.dst.path, &raw),
    }
}

/// DST's map, read and hashed ([`dst_input`]), written to an unnamed
/// temporary file as it is made and read where it lies.
fn map_dst(c: &Ctx<'_>, cancel: &AtomicBool) -> io::Result<MapFile> {
    crate::map_to_temp(dst_input(c)?, c.job, cancel, &mut |_| {}).map(|(m, _)| m)
}

/// The checksum of DST's map ([`dst_input`]), the map written to an
/// unnamed temporary file as it is made: memory stays bounded.
fn dst_checksum(c: &Ctx<'_>, cancel: &AtomicBool) -> io::Result<Option<blkhash::Checksum>> {
    let (_, written) = crate::map_to_temp(dst_input(c)?, c.job, cancel, &mut |_| {})?;
    Ok(written.summary.header.checksum)
}

/// Copy SRC's data to a DST of zeros, hashing nothing.
fn copy_src(c: &Ctx<'_>, dst: Arc<Target>) -> Result<(), Error> {
    let mut sink = CopyThrough::new(CopyTarget {
        src_name: Arc::from(c.src_name),
        dst,
        dst_name: Arc::from(c.dst.name.as_str()),
        block_size: c.job.block_size(),
        // Its workers read and write: one per core by default (16 writers to
        // one DST file made a 2 GiB copy 1.8x slower), more if asked or for
        // a remote SRC.
        threads: c.job.threads().max(write_depth(c, c.job.read_size())),
        counts: c.counts.clone(),
        flush_later: false,
    })
    .map_err(|e| c.dst_error(e))?;
    let read_size = c.job.read_size();
    let mut on_read = |n: u64| {
        c.counts.compared.fetch_add(n, Ordering::Relaxed);
        c.progress.update(c.counts);
    };
    let src = c.src.clone();
    let read = blkimage::read_image(src, &mut sink, read_size, Some(0), c.cancel, &mut on_read);
    // The workers' failure first: it names its input; then the read loop's.
    sink.finish()?;
    read.map_err(|e| c.src_error(e))?;
    c.src.finish().map_err(|e| c.src_error(e))
}

/// Reads in flight when each is also written to DST: as asked, else the
/// source's default for a remote SRC (an NBD export: latency bounds it),
/// but none apart from the digest threads for a local one: writers in
/// parallel to one DST file contend (16 made a 2 GiB first copy 1.19x
/// slower than the digest workers alone).
fn write_depth(c: &Ctx<'_>, read_size: usize) -> usize {
    c.job.io_depth().unwrap_or_else(|| match c.src.is_direct() {
        true => 0,
        false => c.src.default_io_depth(read_size),
    })
}

/// The map of `size` bytes of zeros.
fn zeros_map(job: &Job, size: u64) -> io::Result<Map> {
    let (mut h, builder) = crate::hasher(job)?;
    h.update_zeros(size);
    builder.finalize(h)
}

/// What to write: the differing ranges (the maps read side by side), and
/// SRC's data past DST's end (a file grows with a hole, which reads as
/// zeros).
fn to_write(
    src_map: &dyn MapLike,
    dst_map: &dyn MapLike,
    dst_size: u64,
) -> Result<Vec<Range>, Error> {
    let unusable = |e: blkmap::MapError| Error::unusable("DST's map", e);
    let (dst_pieces, src_pieces) = (dst_map.pieces(), src_map.pieces());
    let d = blkmap::diff_pieces(dst_pieces.map_err(unusable)?, src_pieces.map_err(unusable)?)
        .map_err(unusable)?;
    let mut todo = d.ranges;
    let h = src_map.header();
    let (size, bs) = (h.size, h.block_size as u64);
    if size > dst_size {
        for run in src_map.runs() {
            let (blocks, data) = run.map_err(unusable)?;
            if !data || blocks.end <= dst_size / bs {
                continue;
            }
            // The run's blocks from DST's end: one range of SRC's data.
            let offset = (blocks.start * bs).max(dst_size);
            let end = (blocks.end * bs).min(size);
            match todo.last_mut() {
                Some(r) if r.end() >= offset => r.len = end - r.offset,
                _ => todo.push(Range {
                    offset,
                    len: end - offset,
                }),
            }
        }
    }
    Ok(todo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use blkhash::Options;

    #[test]
    fn the_plan_for_every_case() {
        // (dry run, state describes DST, DST known empty, SRC's map needed)
        let cases = [
            ((false, true, false, true), Plan::Update),
            ((false, false, true, false), Plan::FirstCopy { hash: false }),
            ((false, false, true, true), Plan::FirstCopy { hash: true }),
            ((false, false, false, false), Plan::Compare(DstBlocks::Read)),
            ((false, false, false, true), Plan::Compare(DstBlocks::Read)),
            ((true, true, false, true), Plan::Compare(DstBlocks::State)),
            ((true, false, true, false), Plan::Compare(DstBlocks::Zeros)),
            ((true, false, false, true), Plan::Compare(DstBlocks::Read)),
        ];
        for ((dry, state, empty, needs), want) in cases {
            let known = match (state, empty) {
                (true, _) => DstKnown::State,
                (false, true) => DstKnown::Empty,
                (false, false) => DstKnown::Unknown,
            };
            assert_eq!(
                Plan::choose(dry, known, needs),
                want,
                "{dry} {state} {empty} {needs}"
            );
        }
    }

    fn map(data: &[u8]) -> Map {
        Map::compute(Options::new().block_size(4096), data).unwrap()
    }

    #[test]
    fn what_to_write() {
        let mut dst = vec![1u8; 3 * 4096];
        let mut src = dst.clone();
        src[4096 + 10] = 2;
        assert_eq!(
            to_write(&map(&src), &map(&dst), dst.len() as u64).unwrap(),
            [Range {
                offset: 4096,
                len: 4096
            }]
        );
        // A grown SRC: DST's short last block differs, and is written
        // whole; past it, SRC's data blocks are written and its zero
        // blocks are not (the file grows with a hole there).
        dst.truncate(4096 + 100);
        src.truncate(4096);
        src.extend(vec![1u8; 100]);
        src.extend(vec![3u8; 4096 - 100]);
        src.extend(vec![0u8; 4096]);
        src.extend(vec![4u8; 10]);
        assert_eq!(
            to_write(&map(&src), &map(&dst), dst.len() as u64).unwrap(),
            [
                Range {
                    offset: 4096,
                    len: 4096
                },
                Range {
                    offset: 3 * 4096,
                    len: 10
                }
            ]
        );
    }
}
