//! Resumable hashing (`blksum --checkpoint FILE`): the block digests hashed
//! so far are saved every few seconds as a part of the image's map (from
//! byte 0), with a record of the image; a run started again with the same
//! FILE checks that record and a few sampled blocks, then hashes only the
//! rest. The checksum comes from merging the saved part with the rest.
//!
//! A save merges FILE (read as a stream) with the blocks hashed since the
//! last save into a new FILE, written atomically: a run killed at any
//! moment leaves the old FILE or the new one, and the blocks of a save in
//! flight are hashed again. Memory: the digests of the blocks hashed since
//! the last save, and about 1 MiB for the merge. A save that fails is
//! said once (`Checkpoint::warn`) and tried again at the next one; the
//! run fails once the digests it could not save pass [`MAX_UNSAVED`].
//!
//! One run at a time uses FILE: it locks `FILE.lock` (removed at its end),
//! and a second run fails at once naming the first.
//!
//! The record of the image ([`crate::record`]) covers every file it reads
//! (backing chain, data file, extents) and, for an NBD export, its address
//! and name; sampled data blocks are read again on resuming.

use crate::record::Record;
use crate::state::{SAMPLES, block_matches, spread};
use crate::{Hashed, Job, hasher, read_all};
use blkhash::Algorithm;
use blkimage::{Input, InputRead, Source};
use blkmap::{Header, MapBuilder, MapError, MapReader, Named, Piece};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufReader};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Where and how often to save progress.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// The checkpoint file.
    pub path: PathBuf,
    /// Time between saves, at least (a save that takes long spaces the next
    /// ones, so that saving takes at most about a tenth of the run: the
    /// checkpoint is rewritten whole at each save).
    pub interval: Duration,
    /// On success, leave the image's whole map at `path` (blkmap and
    /// blkdiff read it; a run given it again finishes at once) instead of
    /// removing it.
    pub keep: bool,
    /// How a save that failed is said (once per run): the message names
    /// FILE and the reason.
    pub warn: fn(&str),
}

/// Digests not yet saved (a save failed) that a run keeps in memory before
/// it fails: 64 MiB, the sha256 digests of 128 GiB of data in 64 KiB
/// blocks.
pub const MAX_UNSAVED: usize = 64 << 20;

/// The lock file of the checkpoint `path`: `path` with `.lock` appended.
pub fn lock_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// The default time between saves.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// Hash the image `input` (opened from `name`) as `job` asks, resuming
/// from and saving to `ck`. `progress` gets the bytes passed on, those the
/// checkpoint covered first. The result's `stats` are what this run read
/// (not what earlier runs did).
///
/// (The name is no longer read: the record asks the source where its
/// bytes came from. The parameter stays for the callers.)
pub fn hash(
    _name: &OsStr,
    input: Input,
    job: &Job,
    ck: &Checkpoint,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Hashed> {
    // Asked of the image, not of the window over its rest.
    let rounded = input.rounded();
    let decompressed = input.decompressed();
    let src = crate::seekable(input, "a checkpoint")?;
    let size = src.size();
    let shown = ck.path.display().to_string();
    let _lock = lock(&ck.path, &shown)?;
    let record = Record::of(&*src)?;
    let _ = blkmap::remove_stale_temps(&ck.path);
    let resumed_at = match std::fs::metadata(&ck.path) {
        Ok(_) => resume_point(&ck.path, &*src, job, &record)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => return Err(io::Error::new(e.kind(), format!("{shown}: {e}"))),
    };
    progress(resumed_at);
    let mut saver = Saver {
        path: ck.path.clone(),
        identity: record.to_text().into_bytes(),
        pending: Vec::new(),
    };
    let window = blkimage::Window::new(src.clone(), resumed_at, size - resumed_at)?;
    let at = Span {
        size,
        from: resumed_at,
    };
    let (read, builder) = read_saving(ck, job, &mut saver, window, at, progress)?;
    let header = if ck.keep {
        saver.save(&builder, size, resumed_at, false)?
    } else {
        let h = saver.merged(&builder, size, resumed_at)?;
        if ck.path.exists() {
            std::fs::remove_file(&ck.path)?;
        }
        h
    };
    let checksum = header
        .checksum
        .ok_or_else(|| io::Error::other(format!("{shown}: the blocks do not cover the image")))?;
    Ok(Hashed {
        checksum,
        format: read.format,
        size,
        block_size: job.block_size(),
        stats: read.stats,
        rounded,
        decompressed,
        resumed_at,
    })
}

/// The lock of the checkpoint at `path` (`shown` in messages): a FILE
/// that cannot even be locked could never be saved, which is said now; a
/// FILE another run holds fails at once.
fn lock(path: &Path, shown: &str) -> io::Result<crate::guard::Lock> {
    let lock = lock_path(path);
    if let Err(e) = crate::guard::open_lock_file(&lock) {
        return Err(io::Error::other(format!(
            "{shown}: cannot save the checkpoint here: {e}"
        )));
    }
    crate::guard::lock_file(&lock, shown, crate::guard::Wait::No)
        .map_err(|e| io::Error::new(io::ErrorKind::ResourceBusy, e))
}

/// Read the rest of the image (`window`, from `at.from`) as `job` asks,
/// saving what was hashed every `ck.interval` in a thread of its own: what
/// was read, and the builder that saw every block. A run that fails or is
/// cancelled saves what was hashed for the next run, and fails.
fn read_saving(
    ck: &Checkpoint,
    job: &Job,
    saver: &mut Saver,
    window: blkimage::Window,
    at: Span,
    progress: &mut dyn FnMut(u64),
) -> io::Result<(InputRead, MapBuilder)> {
    let (sink, builder) = hasher(job)?;
    // Reading stops when the user cancels, or when saves keep failing.
    let stop_reading = AtomicBool::new(false);
    let (stop, stopped) = mpsc::channel::<()>();
    let (read, failed) = std::thread::scope(|scope| {
        let (builder, saver, stop_reading) = (&builder, &mut *saver, &stop_reading);
        let periodic = scope
            .spawn(move || save_periodically(ck, job, saver, builder, at, stop_reading, stopped));
        let input = Input::Image(Box::new(window));
        // Every block read is digested and seen by the builder, up to the
        // first failure, before the last save.
        let read = read_all(input, sink, job, stop_reading, progress, |sink| {
            sink.finalize()
        });
        drop(stop);
        let failed = periodic.join().ok().flatten();
        (read, failed)
    });
    if let Some(e) = failed {
        return Err(e);
    }
    if job.cancel().load(Ordering::Relaxed) {
        stop_reading.store(true, Ordering::Relaxed);
    }
    match read {
        Ok((_, read)) if !job.cancel().load(Ordering::Relaxed) => Ok((read, builder)),
        result => {
            let e = match result {
                Err(e) => e,
                Ok(_) => blkimage::interrupted(),
            };
            // What was hashed is kept for the next run.
            Err(match saver.save(&builder, at.size, at.from, true) {
                Ok(_) => e,
                Err(s) => io::Error::new(e.kind(), format!("{e} (and {s})")),
            })
        }
    }
}

/// How often the saving thread looks at the user's cancel.
const POLL: Duration = Duration::from_millis(50);

/// Saves the checkpoint: FILE merged with what the builder took since.
struct Saver {
    path: PathBuf,
    identity: Vec<u8>,
    /// Parts taken from the builder and not yet in FILE (a save failed).
    pending: Vec<Vec<u8>>,
}

impl Saver {
    /// Move the blocks the builder saw since the last call to `pending`:
    /// whether there were any. With no FILE and nothing pending, the empty
    /// part is kept too (an empty image's merge needs one input).
    fn take(&mut self, builder: &MapBuilder, size: u64, offset: u64) -> io::Result<bool> {
        let part = builder.take_part(size, offset)?;
        let new = part.range().len > 0;
        if new || (self.pending.is_empty() && !self.path.exists()) {
            self.pending.push(part.to_bytes());
        }
        Ok(new)
    }

    /// FILE, if there is one, and the pending parts, as merge inputs.
    fn inputs(&self) -> io::Result<Vec<Named<'_>>> {
        let mut inputs: Vec<Named<'_>> = Vec::new();
        match File::open(&self.path) {
            Ok(f) => inputs.push((self.path.display().to_string(), Box::new(BufReader::new(f)))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        for p in &self.pending {
            inputs.push((
                "the blocks hashed by this run".into(),
                Box::new(io::Cursor::new(&p[..])),
            ));
        }
        Ok(inputs)
    }

    /// Save FILE if the builder has blocks it does not.
    fn save_new(&mut self, builder: &MapBuilder, size: u64, offset: u64) -> io::Result<()> {
        if self.take(builder, size, offset)? {
            self.write(true)?;
        }
        Ok(())
    }

    /// Save FILE (a part if `partial`, else the whole map).
    fn save(
        &mut self,
        builder: &MapBuilder,
        size: u64,
        offset: u64,
        partial: bool,
    ) -> io::Result<Header> {
        self.take(builder, size, offset)?;
        self.write(partial)
    }

    /// Bytes of digests taken from the builder and not yet saved.
    fn unsaved(&self) -> usize {
        self.pending.iter().map(Vec::len).sum()
    }

    /// Merge FILE and the pending parts into a new FILE; an error names
    /// FILE and says the checkpoint could not be saved.
    fn write(&mut self, partial: bool) -> io::Result<Header> {
        let identity = Some(self.identity.clone());
        let shown = self.path.display();
        let failed = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("{shown}: cannot save the checkpoint: {}", crate::reason(&e)),
            )
        };
        let inputs = self.inputs().map_err(failed)?;
        let h = blkmap::merge_to_file(inputs, &self.path, identity, partial)
            .map_err(|e| failed(e.into()))?;
        self.pending.clear();
        Ok(h)
    }

    /// The whole map's header (with the checksum), FILE left as it is.
    fn merged(&mut self, builder: &MapBuilder, size: u64, offset: u64) -> io::Result<Header> {
        self.take(builder, size, offset)?;
        Ok(blkmap::merge(self.inputs()?, None, None, false)?)
    }
}

/// The image a run hashes: its size, and the bytes a checkpoint covered
/// when it started.
#[derive(Clone, Copy)]
struct Span {
    size: u64,
    from: u64,
}

/// Save what `builder` saw every `ck.interval` (or less often, when a
/// save takes long) until `stopped` says the reading ended; pass a cancel
/// on to the reader (`stop_reading`). A save that fails is said once and
/// tried again at the next; the error ends the run once the digests not
/// saved pass [`MAX_UNSAVED`].
fn save_periodically(
    ck: &Checkpoint,
    job: &Job,
    saver: &mut Saver,
    builder: &MapBuilder,
    at: Span,
    stop_reading: &AtomicBool,
    stopped: mpsc::Receiver<()>,
) -> Option<io::Error> {
    let mut next = Instant::now() + ck.interval;
    // The last save's failure, once one failed.
    let mut failing: Option<io::Error> = None;
    let mut warned = false;
    let too_much = |saver: &Saver, e: &io::Error| {
        io::Error::new(
            e.kind(),
            format!(
                "{e}; the run stops: the {} MiB of digests it could not save would \
                 keep growing in memory",
                saver.unsaved() >> 20
            ),
        )
    };
    loop {
        // Woken often enough to pass a cancel on to the reader.
        let wait = next.saturating_duration_since(Instant::now()).min(POLL);
        match stopped.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return None,
        }
        if job.cancel().load(Ordering::Relaxed) {
            stop_reading.store(true, Ordering::Relaxed);
        }
        // Once saves fail, the digests they could not save are counted as
        // they grow, not only when the next save (spaced by ten times the
        // last one's length) comes round: a reader faster than the saves
        // hashed 2000 MiB past the bound between two of them.
        if let Some(e) = &failing
            && saver.take(builder, at.size, at.from).is_ok()
            && saver.unsaved() > MAX_UNSAVED
        {
            stop_reading.store(true, Ordering::Relaxed);
            return Some(too_much(saver, e));
        }
        if Instant::now() < next {
            continue;
        }
        let t = Instant::now();
        // A save that fails is tried again with more at the next one: its
        // blocks stay pending, up to a bound.
        match saver.save_new(builder, at.size, at.from) {
            Ok(()) => failing = None,
            Err(e) if saver.unsaved() > MAX_UNSAVED => {
                stop_reading.store(true, Ordering::Relaxed);
                return Some(too_much(saver, &e));
            }
            Err(e) => {
                if !warned {
                    (ck.warn)(&format!(
                        "{e}; trying again every {} s, the run goes on",
                        ck.interval.as_secs_f64()
                    ));
                    warned = true;
                }
                failing = Some(e);
            }
        }
        next = Instant::now() + ck.interval.max(t.elapsed() * 10);
    }
}

/// Check the checkpoint at `path` belongs to this image, digest and block
/// size: the bytes it covers from 0, or why not (an error that says how to
/// start over).
fn resume_point(path: &Path, src: &dyn Source, job: &Job, now: &Record) -> io::Result<u64> {
    let shown = path.display();
    let refuse = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{shown}: {why}; remove it to start over, or give another checkpoint file"),
        )
    };
    let open = || {
        let file =
            File::open(path).map_err(|e| io::Error::new(e.kind(), format!("{shown}: {e}")))?;
        match MapReader::new(BufReader::new(file)) {
            Ok(r) => Ok(r),
            Err(MapError::NotAMap) => Err(refuse("not a checkpoint (not a block map)".into())),
            Err(e) => Err(refuse(format!("not a usable checkpoint: {e}"))),
        }
    };
    let reader = open()?;
    let h = reader.header().clone();
    let Some(recorded) = h.identity.as_deref() else {
        return Err(refuse(
            "a block map with no record of its image (written by an earlier version?), not a checkpoint"
                .into(),
        ));
    };
    if (h.algorithm, h.block_size) != (job.algorithm(), job.block_size()) {
        return Err(refuse(format!(
            "a checkpoint of {} digests of {}-byte blocks, not {} of {}-byte blocks as asked",
            h.algorithm,
            h.block_size,
            job.algorithm(),
            job.block_size()
        )));
    }
    let then = Record::parse(recorded).map_err(|why| {
        refuse(format!(
            "a checkpoint whose record of its image is not one this version reads ({why})"
        ))
    })?;
    if let Some(why) = then.changed_since(now, "the checkpoint") {
        return Err(refuse(format!(
            "not a checkpoint of this image as it is now: {why}"
        )));
    }
    if h.size != src.size() || h.range.offset != 0 {
        return Err(refuse(format!(
            "a checkpoint of bytes {}+{} of a {}-byte image, not of this {}-byte one from its start",
            h.range.offset,
            h.range.len,
            h.size,
            src.size()
        )));
    }
    let unusable = |e: MapError| match e {
        MapError::Io(e) if e.kind() != io::ErrorKind::InvalidData => e,
        other => refuse(format!("not a usable checkpoint: {other}")),
    };
    let data = count_data(reader).map_err(unusable)?;
    let bad = check_samples(open()?, data, src, job.digest_key()).map_err(unusable)?;
    if let Some(i) = bad {
        return Err(refuse(format!(
            "block {i} of the image is not the block the checkpoint recorded: the image changed since"
        )));
    }
    Ok(h.range.len)
}

/// Read the checkpoint through (its trailer checked too): how many data
/// blocks it holds.
fn count_data<R: io::Read>(mut reader: MapReader<R>) -> Result<u64, MapError> {
    let len = reader.header().algorithm.output_len();
    let mut data = 0;
    while let Some(piece) = reader.next_piece()? {
        if let Piece::Data(d) = piece {
            data += (d.len() / len) as u64;
        }
    }
    Ok(data)
}

/// Read a few of the blocks the checkpoint covers and compare them with
/// its digests: the first that differs, if one does. Data blocks are
/// sampled ([`SAMPLES`] of the `data` the checkpoint holds), since zero
/// blocks tell little (two thin exports of one size agree on them), and a
/// few blocks of any kind from the first one on.
fn check_samples<R: io::Read>(
    mut reader: MapReader<R>,
    data: u64,
    src: &dyn Source,
    key: &[u8],
) -> Result<Option<u64>, MapError> {
    let h = reader.header().clone();
    let (alg, bs): (Algorithm, u64) = (h.algorithm, h.block_size as u64);
    let len = alg.output_len();
    let mut wanted_data = spread(data, h.size).into_iter().peekable();
    let mut any = spread(h.blocks(), h.size);
    any.truncate((SAMPLES / 4) as usize);
    let mut wanted_any = any.into_iter().peekable();
    let mut recorded: Vec<(u64, Option<Vec<u8>>)> = Vec::new();
    let (mut at, mut data_at) = (0u64, 0u64);
    while let Some(piece) = reader.next_piece()? {
        let n = match piece {
            Piece::Zeros(n) => n,
            Piece::Data(d) => (d.len() / len) as u64,
        };
        let digest = |i: u64| match piece {
            Piece::Zeros(_) => None,
            Piece::Data(d) => Some(d[(i - at) as usize * len..][..len].to_vec()),
        };
        while let Some(&i) = wanted_any.peek().filter(|&&i| i < at + n) {
            recorded.push((i, digest(i)));
            wanted_any.next();
        }
        if let Piece::Data(_) = piece {
            while let Some(&k) = wanted_data.peek().filter(|&&k| k < data_at + n) {
                let i = at + (k - data_at);
                recorded.push((i, digest(i)));
                wanted_data.next();
            }
            data_at += n;
        }
        at += n;
    }
    recorded.sort_by_key(|(i, _)| *i);
    recorded.dedup_by_key(|(i, _)| *i);
    let mut buf = blkhash::try_zeroed(bs as usize, "a block read again")?;
    for (i, digest) in recorded {
        let offset = i * bs;
        let n = bs.min(h.range.end() - offset) as usize;
        src.read_at(&mut buf[..n], offset)?;
        if !block_matches((alg, key), &buf[..n], digest.as_deref()) {
            return Ok(Some(i));
        }
    }
    Ok(None)
}
