//! blksync as a library: make DST (a raw file, a block device, an NBD
//! export, or an image of another format) hold SRC's guest content,
//! writing only the blocks that differ.
//!
//! [`run`] guards the outputs, classifies and locks DST ([`dst`]), judges
//! the state ([`crate::state::check`]), chooses a [`Plan`] in one place and
//! carries it out ([`plan`]); it prints nothing (the caller draws progress), and
//! returns a [`Report`] or a typed [`Error`] for the command to print.

mod copy;
pub mod dst;
mod error;
mod known;
pub mod plan;
mod target;
mod update;

pub use error::Error;
pub use plan::{DstBlocks, DstKnown, Plan};

use crate::guard;
use crate::job::open_dirty;
use crate::state::check::{DstNow, Verdict};
use crate::{Job, JobSpec, state};
use blkimage::{Input, Source};
use blkmap::{Header, MapFile, Range};
pub use copy::{Counts, Progress};
use dst::Dst;
use std::ffi::OsString;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// What to sync, and how: the command line of `blksync`.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// The image to copy from (any image blksum reads, not a stream).
    pub src: OsString,
    /// The file, device, NBD URL or image to bring up to date.
    pub dst: OsString,
    /// DST's block map saved by the last run (`--state`), or a Proxmox
    /// Backup Server fixed index of what DST holds (DST was restored from
    /// that backup): read, never written.
    pub state: Option<PathBuf>,
    /// Where the state after the run goes (`--save-state`): needed when
    /// `state` is a fixed index, refused otherwise (a map given as the
    /// state is replaced where it lies).
    pub save_state: Option<PathBuf>,
    /// Ignore the state, whatever it holds; read DST and compare.
    pub force_rescan: bool,
    /// DST's format: a DST to create is created in it, an existing one
    /// must be of it.
    pub output_format: Option<blkimage::Format>,
    /// How to open SRC (and DST's format checks) and hash: the digest and
    /// block size not given here are the state's, else the defaults.
    pub job: JobSpec,
    /// Say what would be written; write nothing.
    pub dry_run: bool,
    /// Hash DST again after the copy and check it has SRC's checksum.
    pub verify: bool,
    /// SRC's checksum is wanted (the report carries SRC's map).
    pub checksum: bool,
    /// Wait for another run that holds DST or the state.
    pub wait: bool,
    /// SRC's dirty bitmap that records what changed since the state was
    /// saved: an update reads only the blocks it marks (and a sample of
    /// the others, checked against the state). Used when the state
    /// describes DST; a first copy or a comparison reads SRC whole.
    pub dirty_bitmap: Option<String>,
}

impl Request {
    /// Whether the run needs SRC's block digests, even for a first copy.
    fn needs_src_map(&self) -> bool {
        self.state.is_some() || self.verify || self.checksum
    }

    /// Where the state is written after the run (and removed before DST is
    /// written, and locked during it): `--save-state`, else `--state`.
    pub fn state_out(&self) -> Option<&Path> {
        let index = self.state.as_deref().is_some_and(blkmap::is_fidx_file);
        (self.save_state.as_deref()).or(self.state.as_deref().filter(|_| !index))
    }

    /// `--state` if it is a fixed index (read as DST's map, never
    /// written).
    fn index_state(&self) -> Option<&Path> {
        self.state.as_deref().filter(|p| blkmap::is_fidx_file(p))
    }

    /// How to take a lock another run holds.
    fn wait<'a>(&self, cancel: &'a AtomicBool) -> guard::Wait<'a> {
        match self.wait {
            true => guard::Wait::Until(cancel),
            false => guard::Wait::No,
        }
    }
}

/// What a run did.
#[derive(Debug)]
pub struct Report {
    /// What the run chose to do.
    pub plan: Plan,
    /// SRC's size, and DST's now.
    pub size: u64,
    /// The block size hashed with.
    pub block_size: usize,
    /// Data bytes written to DST.
    pub written: u64,
    /// Bytes made zeros in DST (holes punched or zeros written).
    pub zeroed: u64,
    /// Ranges written or zeroed.
    pub ranges: u64,
    /// SRC's block map's header (its checksum), when the run made the map
    /// (a state, `--verify`, `--checksum`, a comparison): the map itself is
    /// the state, or was never kept whole.
    pub src_map: Option<Header>,
    /// A dry run: what would have been done.
    pub would_write: Option<DryRun>,
    /// An update read through SRC's dirty bitmap: the blocks it marked
    /// (the only ones read and compared, but for the sampled ones).
    pub dirty_blocks: Option<u64>,
    /// DST's state was a PBS fixed index: the chunks of DST read to check
    /// it, of how many (the others were taken on the index's word).
    pub index_samples: Option<(u64, u64)>,
}

/// What a dry run would have done to DST.
#[derive(Debug, PartialEq, Eq)]
pub struct DryRun {
    /// The ranges that would be written or zeroed.
    pub ranges: Vec<Range>,
    /// DST's resize (from, to), if it would be resized.
    pub resize: Option<(u64, u64)>,
}

/// Bring DST up to date with SRC as `req` asks; `cancel` (Ctrl-C,
/// SIGTERM) stops it between reads and writes, and `warn` hears what the
/// command should say on the way (a state ignored, and why; a raw SRC
/// whose size is rounded up to whole sectors).
///
/// The state is removed before DST is written and saved again only once
/// DST is flushed: an interrupted run never leaves a state that claims a
/// block not written.
pub fn run(
    req: &Request,
    cancel: &AtomicBool,
    warn: &mut dyn FnMut(&str),
    progress: &dyn Progress,
) -> Result<Report, Error> {
    let src_name = blkimage::http::redact(&req.src.to_string_lossy()).into_owned();
    index_state_usable(req)?;
    let _state_lock = guard_outputs(req, &src_name, cancel)?;
    if let (Some(p), false) = (req.state_out(), req.dry_run) {
        // A killed run's state, written beside it until DST was flushed:
        // never renamed, it describes nothing.
        let _ = blkmap::remove_stale_temps(p);
    }
    let wait = req.wait(cancel);
    let mut dst = Dst::classify(req, wait)?;

    let (loaded, job) = load_state(req, &src_name)?;
    let src = open_src(req, &job, &src_name, false, warn)?;
    let size = src.size();
    // What SRC reads, to tell a SRC written during the run (an export has
    // no file to look at: its blocks are checked as they are copied).
    let src_before = crate::record::Record::of(&*src);
    let src_watch = src.clone();
    dst.prepare(req, &*src, wait)?;
    let dst_map = match (&req.state, loaded) {
        (Some(p), Some(loaded)) => judge_state(req, p, loaded, &dst, &job, warn)?,
        _ => None,
    };

    let index_samples = (dst_map.as_ref())
        .filter(|_| req.index_state().is_some())
        .map(|m| (state::sample_count(m), m.header().blocks()));
    let known = dst_known(&dst_map, &dst)?;
    let plan = Plan::choose(req.dry_run, known, req.needs_src_map());
    let changes = bitmap_changes(req, plan, &dst_map, &src, &src_before, &job, warn)?;
    let counts = Arc::new(Counts::default());
    let compares = !matches!(plan, Plan::FirstCopy { .. });
    progress.start(size, job.block_size(), compares);
    // From here on DST is written: a failed run leaves it for the next.
    let written = mark_written(req, &dst)?;
    dst.keep();
    let dirty_blocks = changes.as_ref().map(|c| c.dirty_blocks());
    let src = cached_for_bitmap(req, &job, &src_name, src, changes.is_some())?;
    let ctx = plan::Ctx {
        req,
        src_name: &src_name,
        src,
        job: &job,
        dst: &dst,
        dst_map,
        changes,
        src_record: src_before.as_ref().ok(),
        cancel,
        counts: &counts,
        progress,
    };
    let result = plan.carry_out(ctx);
    progress.finish();
    let done = result?;
    if !req.dry_run {
        save_served_side(req, &mut dst, &done)?;
    }
    save_written(&dst, written)?;
    src_unwritten(&src_name, &src_before, &*src_watch)?;
    Ok(Report {
        plan,
        size,
        block_size: job.block_size(),
        written: Counts::get(&counts.written),
        zeroed: Counts::get(&counts.zeroed),
        ranges: Counts::get(&counts.ranges),
        src_map: done.src_map,
        would_write: done.would_write,
        dirty_blocks,
        index_samples,
    })
}

/// What is known of DST's content before it is read: a DST known to hold
/// only zeros is not read.
fn dst_known(dst_map: &Option<MapFile>, dst: &Dst) -> Result<DstKnown, Error> {
    Ok(match dst_map {
        Some(_) => DstKnown::State,
        None if dst.known_empty()? => DstKnown::Empty,
        None => DstKnown::Unknown,
    })
}

/// After a run from an index wrote DST: the record of what DST now is
/// ([`state::written`]), which refuses the next run from that index.
fn save_written(
    dst: &Dst,
    written: Option<(String, state::written::Written)>,
) -> Result<(), Error> {
    if let Some((key, mut w)) = written {
        w.after = Some(dst_now(dst).map_err(|e| Error::io(&dst.name, e))?);
        state::written::save(&key, &w).map_err(|e| Error::io(&dst.name, e))?;
    }
    Ok(())
}

/// What DST is, as the record of a run that wrote it keys it
/// ([`state::written`]): a file by device and inode, a block device by
/// its number, an export by its URL.
fn dst_key(dst: &Dst) -> io::Result<String> {
    use std::os::unix::fs::FileTypeExt;
    if dst.nbd.is_some() && dst.served.is_none() {
        return Ok(format!("nbd {}", dst.name));
    }
    let m = std::fs::metadata(&dst.path)?;
    Ok(match m.file_type().is_block_device() {
        true => format!("device {}", m.rdev()),
        false => format!("file {} {}", m.dev(), m.ino()),
    })
}

/// DST now, as a record of a run that wrote it keeps it.
fn dst_now(dst: &Dst) -> io::Result<crate::record::Record> {
    if dst.nbd.is_some() && dst.served.is_none() {
        return Ok(crate::record::Record {
            size: dst.size,
            map: None,
            remote: Vec::new(),
            files: Vec::new(),
        });
    }
    let m = std::fs::metadata(&dst.path)?;
    let size = if m.is_file() { m.len() } else { dst.size };
    Ok(crate::record::Record::of_target(
        "0".into(),
        &dst.path,
        &m,
        size,
    ))
}

/// Before DST is written: a record that blksync is writing it, for a run
/// that names an index as DST's state, or a DST that has a record (the
/// index stays superseded whatever state later runs name). The record
/// and its key, to complete once DST is flushed. None for a dry run.
fn mark_written(
    req: &Request,
    dst: &Dst,
) -> Result<Option<(String, state::written::Written)>, Error> {
    if req.dry_run {
        return Ok(None);
    }
    let key = dst_key(dst).map_err(|e| Error::io(&dst.name, e))?;
    let had = state::written::load(&key).is_ok_and(|w| w.is_some());
    if req.index_state().is_none() && !had {
        return Ok(None);
    }
    let w = state::written::Written {
        dst: dst.name.clone(),
        state: req.state_out().map(Path::to_path_buf),
        at: state::written::now_secs(),
        after: None,
    };
    state::written::save(&key, &w).map_err(|e| Error::io(&dst.name, e))?;
    Ok(Some((key, w)))
}

/// Why an index may not be DST's state, if blksync's record says a run
/// wrote DST (see [`state::written`]).
fn index_written(dst: &Dst) -> Result<(), String> {
    let key = dst_key(dst).map_err(|e| crate::reason(&e))?;
    let Some((path, w)) = state::written::load(&key)? else {
        return Ok(());
    };
    let now = dst_now(dst).map_err(|e| crate::reason(&e))?;
    match w.refuses_index(&now) {
        Some(why) => Err(format!(
            "{why} (blksync's record {}: remove it only if DST was restored from this backup \
             again since)",
            path.display()
        )),
        None => Ok(()),
    }
}

/// SRC again through the page cache if a bitmap says which blocks to
/// hash (`through_bitmap`): those are the blocks written, and the writers
/// find them there again (a 16 GiB image, 81 MiB dirty, cold cache:
/// 0.19 s against 0.30-0.44 s with direct I/O, which reads them twice
/// from the disk).
fn cached_for_bitmap(
    req: &Request,
    job: &Job,
    src_name: &str,
    src: Arc<dyn Source>,
    through_bitmap: bool,
) -> Result<Arc<dyn Source>, Error> {
    match through_bitmap && src.is_direct() {
        true => open_src(req, job, src_name, true, &mut |_| {}),
        false => Ok(src),
    }
}

/// The state first, as opened and checked intact where it lies (or why it
/// could not be: judged later, with DST at hand), and the job: the state
/// says how to hash, unless the request does.
#[allow(clippy::type_complexity)]
fn load_state(
    req: &Request,
    src_name: &str,
) -> Result<(Option<Result<MapFile, String>>, Job), Error> {
    let mut spec = req.job.clone();
    // An index's key is checked first: a wrong one is its own error.
    if let Some(index) = req.index_state() {
        spec.keyed = crate::index_keyed(index, &spec.open)
            .map_err(|e| Error::unusable(index.to_string_lossy(), e))?;
    }
    let loaded = match &req.state {
        Some(p) if p.exists() => Some(state::open(p, &spec.open)),
        _ => None,
    };
    let saved = loaded.as_ref().and_then(|r| r.as_ref().ok());
    let job = spec
        .resolve(saved.map(|m| (m.header().algorithm, m.header().block_size)))
        .map_err(|e| Error::unusable(src_name, e))?;
    Ok((loaded, job))
}

/// What SRC's dirty bitmap says changed since the state, for an update
/// through a bitmap (`--dirty-bitmap` with a state that describes DST):
/// `None` otherwise, said through `warn` when a bitmap was asked for but
/// no state describes DST (SRC is then read whole).
fn bitmap_changes(
    req: &Request,
    plan: Plan,
    state: &Option<MapFile>,
    src: &Arc<dyn Source>,
    src_record: &io::Result<crate::record::Record>,
    job: &Job,
    warn: &mut dyn FnMut(&str),
) -> Result<Option<crate::incremental::Changes>, Error> {
    let src_name = req.src.to_string_lossy();
    match (&req.dirty_bitmap, state, &req.state) {
        (Some(name), Some(state_map), Some(p)) if plan == Plan::Update => {
            let now = src_record
                .as_ref()
                .map_err(|e| Error::io(&src_name, io::Error::new(e.kind(), e.to_string())))?;
            let base = crate::incremental::Base {
                map: state_map,
                name: &p.display().to_string(),
            };
            src_changes(src, now, job, &src_name, &base, name).map(Some)
        }
        (Some(name), ..) => {
            warn(&format!(
                "{src_name}: dirty bitmap '{name}' not used: no state describes DST, so SRC is read whole"
            ));
            Ok(None)
        }
        _ => Ok(None),
    }
}

/// The run's end: an error if a file SRC reads was written while it ran
/// (`before`: SRC's record when it started; an export has no file to
/// look at: its blocks are checked as they are copied).
fn src_unwritten(
    src_name: &str,
    before: &io::Result<crate::record::Record>,
    src: &dyn Source,
) -> Result<(), Error> {
    if let Ok(before) = before
        && let Ok(now) = crate::record::Record::of(src)
        && let Some(file) = before.first_changed(&now)
    {
        return Err(Error::SrcWritten {
            src: src_name.to_string(),
            file: file.to_path_buf(),
        });
    }
    Ok(())
}

/// What SRC's dirty bitmap `name` says changed since the state (`base`,
/// checked to describe DST) was saved, once the checks of an update
/// passed: the files SRC reads besides itself unchanged since the state
/// recorded them (`now`: SRC's record), a sample of SRC's clean blocks and
/// every clean block whose allocation contradicts the state hold what the
/// state says. The state is then SRC's map as it was when the bitmap
/// started (see [`crate::incremental`]). All before DST is written.
fn src_changes(
    src: &Arc<dyn Source>,
    now: &crate::record::Record,
    job: &Job,
    src_name: &str,
    base: &crate::incremental::Base<'_>,
    name: &str,
) -> Result<crate::incremental::Changes, Error> {
    use crate::incremental::{changes, check_allocation, check_clean};
    let failed = |e| Error::io(src_name, e);
    let changes = changes(&**src, now, base, name, false).map_err(failed)?;
    check_clean(&**src, base, &changes, job.digest_key()).map_err(failed)?;
    check_allocation(src.clone(), base, &changes, job).map_err(failed)?;
    Ok(changes)
}

/// SRC, opened for random access (through the page cache if `cache`) and
/// kept open for the copy; a raw SRC
/// whose size is rounded up is said before copying (DST is made SRC's
/// guest size, not the file's).
fn open_src(
    req: &Request,
    job: &Job,
    src_name: &str,
    cache: bool,
    warn: &mut dyn FnMut(&str),
) -> Result<Arc<dyn Source>, Error> {
    let mut open = job.open_options().clone();
    open.cache |= cache;
    // A compressed raw SRC too is decompressed to be read in any order.
    open.random_access = true;
    let src: Arc<dyn Source> = match open_dirty(&req.src, &open, req.dirty_bitmap.as_deref()) {
        Ok(Input::Image(s)) => Arc::from(s),
        Ok(Input::Stream(_)) => {
            return Err(Error::unusable(
                src_name,
                "a stream: blksync needs random access",
            ));
        }
        Err(e) => return Err(Error::io(src_name, e)),
    };
    if let Some(r) = src.rounded() {
        warn(&format!(
            "{src_name}: {} bytes, copied as {} (a raw image's size is rounded up to a \
             multiple of 512, as QEMU does)",
            r.file_size, r.size
        ));
    }
    if let Some(d) = src.decompressed() {
        warn(&format!("{src_name}: {d}"));
    }
    Ok(src)
}

/// Is the state at `path` DST's? Its map if so; `None` if DST is to be
/// read and compared instead (a rescan, said through `warn` when the state
/// was refused for a reason); an error if the state must be refused.
fn judge_state(
    req: &Request,
    path: &std::path::Path,
    loaded: Result<MapFile, String>,
    dst: &Dst,
    job: &Job,
    warn: &mut dyn FnMut(&str),
) -> Result<Option<MapFile>, Error> {
    let checked = loaded.and_then(|m| {
        let now = match (&dst.read, &dst.nbd) {
            (Some(f), _) => Some(DstNow::File(f)),
            (None, Some(n)) => Some(DstNow::Nbd(
                n,
                dst.served.as_ref().and(dst.file_meta.as_ref()),
            )),
            (None, None) => None,
        };
        // blksync's record first: it names the map that says what DST
        // holds, where a sampled chunk would only say that it differs.
        if req.index_state().is_some() && dst.size == m.header().size {
            index_written(dst)?;
        }
        state::check::check(
            &m,
            path,
            (job.algorithm(), job.digest_key()),
            job.block_size(),
            now,
            dst.size,
        )?;
        Ok(m)
    });
    match state::check::verdict(checked, req.force_rescan) {
        Verdict::Use(m) => Ok(Some(m)),
        Verdict::Rescan { warning: None } => Ok(None),
        Verdict::Rescan { warning: Some(why) } => {
            warn(&format!(
                "{}: state ignored (--force-rescan): {why}",
                path.display()
            ));
            Ok(None)
        }
        Verdict::Refuse(why) => Err(Error::StateRefused {
            state: path.to_path_buf(),
            why,
        }),
    }
}

/// A served image's file changes until its server has closed it: its side
/// record is taken once the server is gone.
fn save_served_side(req: &Request, dst: &mut Dst, done: &plan::Done) -> Result<(), Error> {
    let checksum = done.src_map.as_ref().and_then(|h| h.checksum.as_ref());
    if let (Some(t), Some(p), Some(c)) = (dst.served.take(), req.state_out(), checksum) {
        drop(t);
        let meta = std::fs::metadata(&dst.path).map_err(|e| Error::io(&dst.name, e))?;
        state::save_side(p, Some(state::side_of(c, &dst.path, &meta, meta.len())))
            .map_err(|e| Error::io(p.display(), e))?;
    }
    Ok(())
}

/// Whether `--state` and `--save-state` go together: a fixed index is read
/// as DST's state and never written (it is the backup's), so the state
/// after the run goes to `--save-state`, where no state describes DST yet;
/// a map given as `--state` is replaced where it lies.
fn index_state_usable(req: &Request) -> Result<(), Error> {
    let Some(p) = &req.state else {
        return Ok(());
    };
    let why = match (blkmap::is_fidx_file(p), &req.save_state) {
        (false, None) => return Ok(()),
        (true, None) if req.dry_run => return Ok(()),
        (false, Some(_)) => "--save-state is for a PBS fixed index given as --state (a map given \
                       as --state is replaced where it lies)"
            .to_string(),
        (true, None) => "a PBS fixed index is read as DST's state and never written (it is \
                         the backup's): give --save-state MAP for the state after the copy"
            .to_string(),
        (true, Some(out)) if blkmap::is_fidx_file(out) => {
            format!(
                "--save-state {} is a PBS fixed index: blksync never writes one (give a map's path)",
                out.display()
            )
        }
        (true, Some(out)) => match state::index_superseded(out) {
            Some(why) => why,
            None => return Ok(()),
        },
    };
    Err(Error::unusable(p.display(), why))
}

/// A lock refused: another run holds it (which [`Request::wait`] would
/// wait for), or it could not be taken.
fn locked(e: String) -> Error {
    match e.contains(": in use by ") {
        true => Error::Busy(e),
        false => Error::Guard(e),
    }
}

/// Check that the state, its side record and its lock file can be written
/// without destroying data (none is SRC or DST, each is a regular file of
/// its own kind or missing), that SRC is not DST, and lock the state for
/// the run.
fn guard_outputs(
    req: &Request,
    src_name: &str,
    cancel: &AtomicBool,
) -> Result<Option<guard::Lock>, Error> {
    let inputs = [
        guard::Input {
            name: &req.src,
            role: "SRC",
        },
        guard::Input {
            name: &req.dst,
            role: "DST",
        },
    ];
    if let (Ok(a), Ok(b)) = (std::fs::metadata(&req.src), std::fs::metadata(&req.dst))
        && (a.dev(), a.ino()) == (b.dev(), b.ino())
    {
        return Err(Error::unusable(
            req.dst.to_string_lossy(),
            format!("is SRC ({src_name}): nothing to copy"),
        ));
    }
    let Some(p) = req.state_out() else {
        return Ok(None);
    };
    let index = req.index_state();
    let inputs: Vec<_> = (inputs.into_iter())
        .chain(index.map(|name| guard::Input {
            name: name.as_os_str(),
            role: "the state (a PBS fixed index)",
        }))
        .collect();
    let (side, lock) = (state::side_path(p), state::lock_path(p));
    let outputs = [
        guard::Output {
            path: p,
            what: "a block map (the state)",
            own_kind: Some(blkmap::is_map),
        },
        guard::Output {
            path: &side,
            what: "the state's side record",
            own_kind: Some(state::is_side),
        },
        guard::Output {
            path: &lock,
            what: "the state's lock file",
            own_kind: None,
        },
    ];
    guard::check_outputs(&outputs, &inputs).map_err(Error::Guard)?;
    let name = p.display().to_string();
    // A dry run writes nothing: it creates (and removes) no lock file, and
    // locks one that exists.
    if req.dry_run {
        if !lock.exists() {
            return Ok(None);
        }
        let f = guard::open_lock_file(&lock).map_err(Error::Guard)?;
        return guard::lock(f, &name, req.wait(cancel))
            .map(Some)
            .map_err(locked);
    }
    guard::lock_file(&lock, &name, req.wait(cancel))
        .map(Some)
        .map_err(locked)
}
