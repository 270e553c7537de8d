//! Incremental maps: the map of an image now, from its map at an earlier
//! point (the base) and a dirty bitmap QEMU kept since that point, reading
//! only the blocks the bitmap marks. The construction is an ordered digest
//! of block digests, so the clean blocks' digests taken from the base and
//! the dirty ones hashed again give the whole checksum exactly.
//!
//! A dirty bitmap records the guest writes QEMU made to the image that
//! holds it, from when it was created or last cleared, and nothing else.
//! What keeps anything else from giving a wrong map ([`Check`] names each):
//! - the base is of the image's size, digest and block size (`size`,
//!   `parameters`);
//! - a bitmap QEMU marks in use (inconsistent) is refused by the source,
//!   and a disabled one here: it stopped recording when it was disabled
//!   (`bitmap`);
//! - the files the image reads besides itself (backing chain, external
//!   data file, extents) are the ones the base recorded, unchanged
//!   (`files`), or the export is the one it recorded (`export`): a bitmap
//!   never sees a write to a backing file, an unsafe rebase, or a data
//!   file written outside QEMU. A base without that record is refused
//!   unless the update is verified;
//! - what the image's extents say now agrees with the base for every clean
//!   block (`allocation`): a clean block the base records as zeros that
//!   the image now holds as data, or one it records as data that now reads
//!   as a hole or zeros, contradicts the bitmap (a write before the bitmap
//!   existed, a shrink and grow, another image under the same bitmap
//!   name); such blocks are read, and any that differs refuses the update;
//! - [`SAMPLES`] clean blocks, spread over the image (data blocks first:
//!   they tell more), are read and must hold what the base says
//!   (`samples`);
//! - with `verify`, every clean block is read too (`verify`): the audit,
//!   and the tests' oracle.
//!
//! Over NBD the files behind an export cannot be seen: only `export`,
//! `allocation` and `samples` speak for them (the README's list).

use crate::record::Record;
use crate::state::block_matches;
use crate::{Job, hasher, read_all};
use blkimage::{BitmapInfo, Input, Masked, Source};
use blkmap::{Header, MapLike, Output, Pieces};
use std::ffi::OsStr;
use std::io;
use std::ops::Range;
use std::sync::Arc;

/// Clean blocks re-read to check the base, at least (fewer only in an
/// image with fewer clean blocks).
pub const SAMPLES: u64 = 16;

/// A check an update made before trusting the base's digests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The base is of the image's size.
    Size,
    /// The base is of the job's digest and block size.
    Parameters,
    /// The bitmap is consistent, enabled and covers the image.
    Bitmap,
    /// The files the image reads besides itself are the base's, unchanged.
    Files,
    /// The export is the one the base was made from.
    Export,
    /// The image's allocation agrees with the base on the clean blocks.
    Allocation,
    /// Sampled clean blocks hold what the base says.
    Samples,
    /// Every clean block was read and holds what the base says.
    Verify,
}

impl Check {
    /// The check's name in reports (`--json`'s `checks`).
    pub fn name(self) -> &'static str {
        match self {
            Check::Size => "size",
            Check::Parameters => "parameters",
            Check::Bitmap => "bitmap",
            Check::Files => "files",
            Check::Export => "export",
            Check::Allocation => "allocation",
            Check::Samples => "samples",
            Check::Verify => "verify",
        }
    }
}

/// The base an update starts from: a map (in memory, or read where it
/// lies: [`blkmap::MapFile`]), and the name it was loaded from, for
/// messages.
pub struct Base<'a> {
    /// The map of the image when the bitmap was created or last cleared.
    pub map: &'a (dyn MapLike + Sync),
    /// Its name, as the user gave it.
    pub name: &'a str,
}

/// What a bitmap says changed, in blocks of the base's size, and the
/// checks made so far.
#[derive(Clone, Debug)]
pub struct Changes {
    /// The bitmap, as the source described it.
    pub bitmap: BitmapInfo,
    /// Dirty block indexes: in order, merged.
    pub blocks: Vec<Range<u64>>,
    /// Bytes the bitmap marks dirty (before widening to blocks).
    pub dirty_bytes: u64,
    /// The checks that passed, in the order they ran.
    pub checks: Vec<Check>,
}

impl Changes {
    /// Blocks to hash again.
    pub fn dirty_blocks(&self) -> u64 {
        self.blocks.iter().map(|r| r.end - r.start).sum()
    }

    /// The dirty blocks as byte ranges of an image of `size` bytes.
    pub fn byte_ranges(&self, block_size: usize, size: u64) -> Vec<Range<u64>> {
        byte_ranges(&self.blocks, block_size, size)
    }

    /// Whether block `i` is dirty.
    pub fn is_dirty(&self, i: u64) -> bool {
        let k = self.blocks.partition_point(|r| r.end <= i);
        self.blocks.get(k).is_some_and(|r| r.start <= i)
    }
}

/// Block index ranges as byte ranges of an image of `size` bytes.
fn byte_ranges(blocks: &[Range<u64>], block_size: usize, size: u64) -> Vec<Range<u64>> {
    let bs = block_size as u64;
    (blocks.iter())
        .map(|r| r.start * bs..(r.end * bs).min(size))
        .filter(|r| r.start < r.end)
        .collect()
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// An update through a dirty bitmap refused because the bitmap cannot say
/// what changed (the `io::Error`'s inner error, of kind
/// [`io::ErrorKind::InvalidData`]): the image must be read whole. A front
/// end recognizes it to say how its user does that (`blkmap` without
/// `--base`, `blksync` without `--dirty-bitmap`, Python's `map_range()`),
/// which the library cannot know.
#[derive(Debug)]
pub struct ReadWhole {
    why: String,
    verify_helps: bool,
}

impl ReadWhole {
    /// Verifying the update (every clean block read too) would do
    /// instead: the base records nothing of its image.
    pub fn verify_helps(&self) -> bool {
        self.verify_helps
    }
}

impl std::fmt::Display for ReadWhole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: read the image whole", self.why)
    }
}

impl std::error::Error for ReadWhole {}

/// [`ReadWhole`] for `why`.
fn read_whole(why: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        ReadWhole {
            why,
            verify_helps: false,
        },
    )
}

/// What bitmap `name` of `src` says changed since `base`, once the base is
/// known to fit: same size, the files the image reads besides itself
/// unchanged since the base recorded them (`now` is the image's record
/// now: [`Record::of`]), an enabled bitmap (or one whose state the source
/// does not say). A base that records nothing of its image (written by an
/// earlier version) is refused, unless `verified` (every block will be
/// read and compared: [`verify`]).
pub fn changes(
    src: &dyn Source,
    now: &Record,
    base: &Base<'_>,
    name: &str,
    verified: bool,
) -> io::Result<Changes> {
    let size = src.size();
    let header = base.map.header();
    if header.is_partial() {
        return Err(invalid(format!(
            "{} is a part of a map, not a whole map: merge the parts first (blkmap merge)",
            base.name
        )));
    }
    if header.size != size {
        return Err(invalid(format!(
            "{} is the map of a {}-byte image and this one is {size} bytes: not its earlier map",
            base.name, header.size
        )));
    }
    let mut checks = vec![Check::Size];
    checks.extend(check_record(now, &header, base.name, verified)?);
    let dirty = dirty(src, name)?;
    checks.push(Check::Bitmap);
    let (dirty_bytes, bitmap) = (dirty.bytes(), dirty.bitmap.clone());
    Ok(Changes {
        blocks: dirty.into_blocks(header.block_size),
        dirty_bytes,
        bitmap,
        checks,
    })
}

/// Check the files the image reads besides itself (or its export) against
/// the record the base keeps: the check made, if one could be.
fn check_record(
    now: &Record,
    header: &Header,
    base_name: &str,
    verified: bool,
) -> io::Result<Option<Check>> {
    let Some(recorded) = header.identity.as_deref() else {
        if verified {
            return Ok(None);
        }
        let why = format!(
            "{} records nothing of the image it was made from (a PBS fixed index, or a map \
             an earlier version wrote), so the files the image reads besides itself cannot be \
             checked",
            base_name
        );
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            ReadWhole {
                why,
                verify_helps: true,
            },
        ));
    };
    let then = Record::parse(recorded).map_err(|why| {
        read_whole(format!(
            "{}: its record of the image it was made from is not one this version reads \
             ({why})",
            base_name
        ))
    })?;
    if let Some(why) = then.below_image_changed(now, base_name) {
        return Err(read_whole(format!(
            "{why}; a dirty bitmap records writes to the image that holds it only, so the \
             bitmap cannot say what changed"
        )));
    }
    // Reading every block (`verified`) finds what another file holds.
    if let Some(why) = then.image_replaced(now, base_name).filter(|_| !verified) {
        return Err(invalid(format!(
            "{why}: make a full map, or verify the update (every block read)"
        )));
    }
    // An export (read from elsewhere, no version of its own) against an
    // export; files, or files over HTTP(S), against the same.
    let remote_only = |r: &Record| r.files.is_empty() && !r.remote.is_empty();
    let now_export = remote_only(now) && now.remote.iter().all(|r| r.version.is_empty());
    Ok(match (remote_only(&then), now_export, remote_only(now)) {
        (true, true, _) => Some(Check::Export),
        (true, false, true) | (false, false, _) => Some(Check::Files),
        _ => None,
    })
}

/// The ranges bitmap `name` of `src` marks dirty, if it can be trusted to
/// mark every write: one QEMU marks in use is refused by the source, and a
/// disabled one here (it has recorded no write since it was disabled).
pub fn dirty(src: &dyn Source, name: &str) -> io::Result<blkimage::Dirty> {
    let dirty = src.dirty(name)?;
    if dirty.bitmap.enabled == Some(false) {
        return Err(invalid(format!(
            "dirty bitmap '{name}' is disabled: it has recorded no write since it was \
             disabled, so it may not mark every block written since; merge it into an \
             enabled bitmap (qemu-img bitmap --merge) and use that one"
        )));
    }
    Ok(dirty)
}

/// The clean blocks whose allocation in `src` now contradicts what `map`
/// (the base) records: recorded as zeros and now holding data, or
/// recorded as data and now reading as a hole or zeros throughout. Block
/// index ranges, in order. The bitmap says none of them was written, yet
/// the image's metadata says something changed there: each must be read.
/// Costs the extents only (qcow2 tables, NBD block status).
pub fn allocation_conflicts(
    src: &dyn Source,
    map: &dyn MapLike,
    changes: &Changes,
) -> io::Result<Vec<Range<u64>>> {
    let (bs, size) = {
        let h = map.header();
        (h.block_size as u64, h.size)
    };
    // Blocks holding any data now.
    let mut data: Vec<Range<u64>> = Vec::new();
    let mut at = 0;
    while at < size {
        let extents = src.extents(at, size - at)?;
        let Some(last) = extents.last() else {
            return Err(invalid(format!(
                "the image described no extent at offset {at}"
            )));
        };
        at = last.end();
        for e in extents.iter().filter(|e| !e.kind.is_zero() && e.len > 0) {
            append(&mut data, e.offset / bs..e.end().div_ceil(bs));
        }
    }
    let (mut zero, mut recorded) = (Vec::new(), Vec::new());
    for run in map.runs() {
        match run? {
            (r, true) => append(&mut recorded, r),
            (r, false) => append(&mut zero, r),
        }
    }
    let conflicts = union(&intersect(&zero, &data), &subtract(&recorded, &data));
    Ok(subtract(&conflicts, &changes.blocks))
}

/// Add `r` to the ordered ranges `v`, merging it with the last one.
fn append(v: &mut Vec<Range<u64>>, r: Range<u64>) {
    match v.last_mut() {
        Some(last) if last.end >= r.start => last.end = last.end.max(r.end),
        _ => v.push(r),
    }
}

/// Walk two ordered, merged range lists together: `keep(in_a, in_b)` says
/// which pieces the result holds (ordered, merged). One pass over both,
/// no list but the result (a bitmap's may be long).
fn combine(
    a: &[Range<u64>],
    b: &[Range<u64>],
    keep: impl Fn(bool, bool) -> bool,
) -> Vec<Range<u64>> {
    let mut pa = a.iter().flat_map(|r| [r.start, r.end]).peekable();
    let mut pb = b.iter().flat_map(|r| [r.start, r.end]).peekable();
    let (mut in_a, mut in_b) = (false, false);
    let mut at: Option<u64> = None;
    let mut out = Vec::new();
    loop {
        let next = match (pa.peek(), pb.peek()) {
            (Some(&x), Some(&y)) => x.min(y),
            (Some(&x), None) => x,
            (None, Some(&y)) => y,
            (None, None) => break,
        };
        if let Some(from) = at
            && from < next
            && keep(in_a, in_b)
        {
            append(&mut out, from..next);
        }
        while pa.next_if_eq(&next).is_some() {
            in_a = !in_a;
        }
        while pb.next_if_eq(&next).is_some() {
            in_b = !in_b;
        }
        at = Some(next);
    }
    out
}

fn union(a: &[Range<u64>], b: &[Range<u64>]) -> Vec<Range<u64>> {
    combine(a, b, |x, y| x || y)
}

fn intersect(a: &[Range<u64>], b: &[Range<u64>]) -> Vec<Range<u64>> {
    combine(a, b, |x, y| x && y)
}

fn subtract(a: &[Range<u64>], b: &[Range<u64>]) -> Vec<Range<u64>> {
    combine(a, b, |x, y| x && !y)
}

/// Clean block indexes to sample: [`SAMPLES`] spread over the clean data
/// blocks of the base, then, if there are fewer, over its clean zero
/// blocks. Memory: the base's runs as ranges, never a list of blocks.
fn samples(base: &dyn MapLike, changes: &Changes) -> io::Result<Vec<u64>> {
    let (mut data, mut zero) = (Vec::new(), Vec::new());
    for run in base.runs() {
        match run? {
            (r, true) => append(&mut data, r),
            (r, false) => append(&mut zero, r),
        }
    }
    let mut picked = spread(&subtract(&data, &changes.blocks), SAMPLES);
    if picked.len() < SAMPLES as usize {
        let rest = SAMPLES - picked.len() as u64;
        picked.extend(spread(&subtract(&zero, &changes.blocks), rest));
        picked.sort_unstable();
    }
    Ok(picked)
}

/// `n` of the blocks in the ordered ranges `v`, spread evenly (all of
/// them if there are fewer).
fn spread(v: &[Range<u64>], n: u64) -> Vec<u64> {
    let total = count(v);
    let wanted: Vec<u64> = match total <= n {
        true => (0..total).collect(),
        false => (0..n)
            .map(|k| (k as u128 * total as u128 / n as u128) as u64)
            .collect(),
    };
    // The k-th block of the ranges, for each wanted k (in order).
    let (mut out, mut r, mut before) = (Vec::with_capacity(wanted.len()), 0, 0);
    for k in wanted {
        while before + (v[r].end - v[r].start) <= k {
            before += v[r].end - v[r].start;
            r += 1;
        }
        out.push(v[r].start + (k - before));
    }
    out
}

/// Read the sampled clean blocks of `src` and check each holds what the
/// base says; the bytes read. A block that does not: the base is not this
/// image's earlier map, or the image changed behind the bitmap's back.
/// The base's digests are keyed with `key` (empty: not keyed).
pub fn check_clean(
    src: &dyn Source,
    base: &Base<'_>,
    changes: &Changes,
    key: &[u8],
) -> io::Result<u64> {
    check_picked(src, base, changes, &samples(base.map, changes)?, key)
}

/// [`check_clean`] of the clean blocks `picked` ([`samples`]).
fn check_picked(
    src: &dyn Source,
    base: &Base<'_>,
    changes: &Changes,
    picked: &[u64],
    key: &[u8],
) -> io::Result<u64> {
    let map = base.map;
    let h = map.header();
    let bs = h.block_size as u64;
    let mut buf = blkhash::try_zeroed(bs as usize, "a sampled block")?;
    let mut read = 0;
    for &i in picked {
        let offset = i * bs;
        let n = bs.min(h.size - offset) as usize;
        src.read_at(&mut buf[..n], offset)?;
        read += n as u64;
        let recorded = map.block(i)?;
        if !block_matches((h.algorithm, key), &buf[..n], recorded.as_deref()) {
            return Err(invalid(format!(
                "{} is not its map as it was when bitmap '{}' was created or cleared: \
                 block {i} (offset {offset}) holds other data, and the bitmap says it was \
                 not written since",
                base.name, changes.bitmap.name
            )));
        }
    }
    Ok(read)
}

/// Read the clean blocks whose allocation contradicts the base
/// ([`allocation_conflicts`]) and check each holds what the base says:
/// the blocks and bytes read. Any that does not refuses the update, naming
/// the first ranges. What blksync checks before it writes anything.
pub fn check_allocation(
    src: Arc<dyn Source>,
    base: &Base<'_>,
    changes: &Changes,
    job: &Job,
) -> io::Result<(u64, u64)> {
    let conflicts = allocation_conflicts(&*src, base.map, changes)?;
    if conflicts.is_empty() {
        return Ok((0, 0));
    }
    let (fresh, read) = hash_blocks(src, &conflicts, job, &mut |_| {})?;
    let mut differ: Vec<Range<u64>> = Vec::new();
    for i in conflicts.iter().flat_map(|r| r.clone()) {
        let now = match fresh.block(i) {
            Some(blkmap::Block::Data(d)) => Some(d),
            _ => None,
        };
        if now != base.map.block(i)?.as_deref() {
            append(&mut differ, i..i + 1);
        }
    }
    refuse_unmarked(base, &differ, &changes.bitmap.name)?;
    Ok((count(&conflicts), read.stats.data))
}

fn count(blocks: &[Range<u64>]) -> u64 {
    blocks.iter().map(|r| r.end - r.start).sum()
}

/// Refuse the update if any clean block in `differ` (hashed again since
/// its allocation contradicts the base) differs from the base: the bitmap
/// did not mark them.
fn refuse_unmarked(base: &Base<'_>, differ: &[Range<u64>], bitmap: &str) -> io::Result<()> {
    if differ.is_empty() {
        return Ok(());
    }
    let h = base.map.header();
    let ranges: Vec<blkmap::Range> = byte_ranges(differ, h.block_size, h.size)
        .into_iter()
        .map(|r| blkmap::Range {
            offset: r.start,
            len: r.end - r.start,
        })
        .collect();
    Err(read_whole(unmarked_text(
        &ranges,
        base,
        bitmap,
        "their allocation is not what it was, and the bitmap does not mark them (written \
         before the bitmap existed or was cleared, cut off by a shrink, or another image)",
    )))
}

/// The error for `ranges` that changed since the base without `bitmap`
/// marking them: the first 8 named, then `why`.
fn unmarked(ranges: &[blkmap::Range], base: &Base<'_>, bitmap: &str, why: &str) -> io::Error {
    invalid(unmarked_text(ranges, base, bitmap, why))
}

/// [`unmarked`]'s words.
fn unmarked_text(ranges: &[blkmap::Range], base: &Base<'_>, bitmap: &str, why: &str) -> String {
    let shown: Vec<String> = (ranges.iter().take(8))
        .map(|r| format!("{}+{}", r.offset, r.len))
        .collect();
    let more = if ranges.len() > 8 { ", ..." } else { "" };
    let count = match ranges.len() {
        1 => "1 range".to_string(),
        n => format!("{n} ranges"),
    };
    format!(
        "{count} changed since {} without bitmap '{bitmap}' marking them: {}{more}; {why}; \
         nothing written",
        base.name,
        shown.join(", ")
    )
}

/// An incremental map, written, and what it took.
#[derive(Debug)]
pub struct Updated {
    /// The image's map now as written (byte for byte the map a full run
    /// would make, with the image's record now as its identity): its
    /// header, with the checksum.
    pub header: Header,
    /// Its data blocks.
    pub data_blocks: u64,
    /// "qcow2", "raw" (an NBD export), ...
    pub format: String,
    /// What the bitmap said, and the checks that passed.
    pub changes: Changes,
    /// Clean blocks re-read to check the base.
    pub sampled: u64,
    /// Clean blocks read because their allocation contradicts the base.
    pub conflicting: u64,
    /// Bytes read from the image: the dirty blocks' data, the samples, the
    /// conflicting blocks, and with `verify` the data read again to verify.
    pub read_bytes: u64,
}

/// The map of `src` (opened from `image`) now, from `base` and the dirty
/// bitmap `bitmap`, written to `out` (new and empty): the base checked
/// ([`changes`], [`check_clean`], [`allocation_conflicts`]), then only the
/// dirty blocks and the clean blocks whose allocation contradicts the base
/// read and hashed, as `job` says (its digest and block size must be the
/// base's), and the new map written in one pass over the base's blocks,
/// which checks the base as a load does. With `verify`, every block is
/// read again after ([`verify`]), and any that changed without the bitmap
/// marking it refuses the update. `progress` gets the bytes passed on, the
/// clean ones included (twice the image with `verify`). On an error, what
/// `out` holds is not a map: write it to a temporary file
/// ([`blkmap::save_with`]).
///
/// Memory: the dirty blocks' digests and the base's runs as ranges,
/// never the base or the new map.
///
/// ```no_run
/// use blkjob::incremental::{Base, update_map};
/// let old = blkmap::MapFile::open("disk.map").unwrap();
/// let job = blkjob::JobSpec::default()
///     .resolve(Some((old.header().algorithm, old.header().block_size)))
///     .unwrap();
/// let src = blkjob::seekable(job.open("disk.qcow2").unwrap(), "an update").unwrap();
/// let base = Base { map: &old, name: "disk.map" };
/// let new = blkmap::save_with("disk.map".as_ref(), &[], |mut out| {
///     update_map(src, "disk.qcow2".as_ref(), &base, "nightly", false, &job, &mut |_| {}, &mut out)
/// })
/// .unwrap();
/// println!("{}  disk.qcow2", new.header.checksum.unwrap());
/// ```
///
/// (The name is no longer read: the record asks the source where its
/// bytes came from. The parameter stays for the callers.)
#[allow(clippy::too_many_arguments)]
pub fn update_map(
    src: Arc<dyn Source>,
    _image: &OsStr,
    base: &Base<'_>,
    bitmap: &str,
    verify: bool,
    job: &Job,
    progress: &mut dyn FnMut(u64),
    out: &mut dyn Output,
) -> io::Result<Updated> {
    if let Some(why) = crate::header_mismatch(&base.map.header(), job.algorithm(), job.block_size())
    {
        return Err(invalid(format!("{}: {why}", base.name)));
    }
    // Taken before anything is read: a file written during the run then
    // differs from the record at the next update.
    let now = Record::of(&*src)?;
    let mut changes = changes(&*src, &now, base, bitmap, verify)?;
    changes.checks.insert(1, Check::Parameters);
    let conflicts = allocation_conflicts(&*src, base.map, &changes)?;
    let read = union(&changes.blocks, &conflicts);
    // Picked once: each pick reads the base's runs.
    let picked = samples(base.map, &changes)?;
    // The samples are read while the blocks are hashed (nothing is
    // written before both are done): their seeks then cost no time.
    let (sampled_bytes, hashed) = std::thread::scope(|s| {
        let check = s.spawn(|| check_picked(&*src, base, &changes, &picked, job.digest_key()));
        let hashed = hash_blocks(src.clone(), &read, job, progress);
        let sampled = check
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (sampled, hashed)
    });
    // A base that is not the image's is the error to report first: it
    // says why the rest is wrong.
    let sampled_bytes = sampled_bytes?;
    let (fresh, stats) = hashed?;
    let how = blkmap::Splice {
        fresh: &fresh,
        ranges: &read,
        compare: &conflicts,
        identity: now.identity(),
    };
    let of_base = |e: blkmap::MapError| io::Error::from(e.of(base.name));
    let (spliced, out) =
        blkmap::splice(base.map.pieces().map_err(of_base)?, how, out).map_err(|e| match e {
            blkmap::MapError::Io(e) => e,
            other => of_base(other),
        })?;
    refuse_unmarked(base, &spliced.differ, bitmap)?;
    changes.checks.extend([Check::Allocation, Check::Samples]);
    let mut verified_bytes = 0;
    if verify {
        verified_bytes = check_verified(src, out, base, bitmap, job, progress)?;
        changes.checks.push(Check::Verify);
    }
    Ok(Updated {
        header: spliced.header,
        data_blocks: spliced.data_blocks,
        format: stats.format,
        sampled: picked.len() as u64,
        conflicting: count(&conflicts),
        read_bytes: stats.stats.data + sampled_bytes + verified_bytes,
        changes,
    })
}

/// Hash the blocks `blocks` of `src` alone (every other range a hole to
/// the reader, never read): a part covering the image whose blocks in
/// `blocks` are the image's.
fn hash_blocks(
    src: Arc<dyn Source>,
    blocks: &[Range<u64>],
    job: &Job,
    progress: &mut dyn FnMut(u64),
) -> io::Result<(blkmap::Part, blkimage::InputRead)> {
    let size = src.size();
    let visible = byte_ranges(blocks, job.block_size(), size);
    let masked = Masked::new(src, visible)?;
    let (sink, builder) = hasher(job)?;
    let input = Input::Image(Box::new(masked));
    read_all(input, sink, job, job.cancel(), progress, |sink| {
        builder.finalize_part(sink, size, 0)
    })
}

/// [`verify`] of the map `updated` has just been written to, as an error
/// naming the ranges (the first 8) when any differ: what `--verify` and
/// Python's `verify=True` report, before anything is renamed. The bytes
/// it read from the image.
pub fn check_verified(
    src: Arc<dyn Source>,
    updated: &mut dyn Output,
    base: &Base<'_>,
    bitmap: &str,
    job: &Job,
    progress: &mut dyn FnMut(u64),
) -> io::Result<u64> {
    updated.seek(io::SeekFrom::Start(0))?;
    let reader = blkmap::MapReader::new(io::BufReader::with_capacity(1 << 20, updated))?;
    let verified = verify(src, reader, job, progress)?;
    if verified.differ.is_empty() {
        return Ok(verified.read_bytes);
    }
    Err(unmarked(
        &verified.differ,
        base,
        bitmap,
        "found by reading every block",
    ))
}

/// What [`verify`] found.
#[derive(Debug)]
pub struct Verified {
    /// The block ranges that differ (empty when the incremental map is the
    /// image's).
    pub differ: Vec<blkmap::Range>,
    /// The bytes read from the image (its data: zeros and holes are not
    /// read).
    pub read_bytes: u64,
}

/// Read all of `src` and compare with `updated` (its incremental map, as
/// pieces): the block ranges that differ, each a block the bitmap did not
/// mark whose content changed (a bitmap that missed a write, or a base
/// that is not the image's). Empty when the incremental map is the
/// image's. The full map is written to an unnamed temporary file and read
/// back beside `updated`: memory stays bounded.
pub fn verify(
    src: Arc<dyn Source>,
    updated: impl Pieces,
    job: &Job,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Verified> {
    let size = src.size();
    let whole = blkimage::Window::new(src, 0, size)?;
    let mut file = crate::temp_file("the full map a verification compares")?;
    let builder = blkmap::MapBuilder::writing(
        job.algorithm(),
        job.block_size(),
        Box::new(file.try_clone()?),
        false,
        None,
    )?
    .block_key(job.digest_key());
    let mut h = blkhash::Pipeline::new(job.hasher_options())?;
    h.set_observer(builder.observer());
    let input = Input::Image(Box::new(whole));
    let (_, read) = read_all(input, h, job, job.cancel(), progress, |h| {
        builder.finalize_written(h)
    })?;
    use std::io::Seek;
    file.rewind()?;
    let full = blkmap::MapReader::new(io::BufReader::with_capacity(1 << 20, file))?;
    let diff = blkmap::diff_pieces(updated, full).map_err(|e| invalid(e.to_string()))?;
    Ok(Verified {
        differ: diff.ranges,
        read_bytes: read.stats.data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use blkimage::{Dirty, Extent, ExtentKind};
    use blkmap::Map;
    use std::sync::atomic::{AtomicU64, Ordering};

    const BS: usize = 4096;

    /// An image in memory with one dirty bitmap, counting bytes read.
    struct Mem {
        data: Vec<u8>,
        dirty: Vec<Range<u64>>,
        enabled: bool,
        read: AtomicU64,
        /// Every range allocated (a preallocated image), rather than holes
        /// where 512-byte sectors read as zeros (a sparse one).
        preallocated: bool,
    }

    fn mem(data: Vec<u8>, dirty: Vec<Range<u64>>) -> Mem {
        Mem {
            data,
            dirty,
            enabled: true,
            read: AtomicU64::new(0),
            preallocated: false,
        }
    }

    impl Source for Mem {
        fn format(&self) -> &str {
            "mem"
        }
        fn size(&self) -> u64 {
            self.data.len() as u64
        }
        fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
            let mut v: Vec<Extent> = Vec::new();
            for at in (offset..offset + len).step_by(512) {
                let end = (at + 512).min(offset + len);
                let zero = self.data[at as usize..end as usize].iter().all(|&b| b == 0);
                let kind = match zero && !self.preallocated {
                    true => ExtentKind::Hole,
                    false => ExtentKind::Data,
                };
                match v.last_mut() {
                    Some(e) if e.kind == kind => e.len += end - at,
                    _ => v.push(Extent {
                        offset: at,
                        len: end - at,
                        kind,
                    }),
                }
            }
            Ok(v)
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.read.fetch_add(buf.len() as u64, Ordering::Relaxed);
            let o = offset as usize;
            buf.copy_from_slice(&self.data[o..o + buf.len()]);
            Ok(())
        }
        fn dirty(&self, name: &str) -> io::Result<Dirty> {
            let bitmap = BitmapInfo {
                name: name.into(),
                granularity: Some(512),
                in_use: Some(false),
                enabled: Some(self.enabled),
            };
            let ranges = self.dirty.clone();
            Ok(Dirty { bitmap, ranges })
        }
    }

    fn job() -> Job {
        let spec = crate::JobSpec {
            block_size: Some(BS),
            threads: Some(2),
            ..Default::default()
        };
        spec.build().unwrap()
    }

    fn map_of(data: &[u8]) -> Map {
        Map::compute(blkhash::Options::new().block_size(BS), data).unwrap()
    }

    /// 64 blocks: data, zeros, data; the last block short.
    fn image() -> Vec<u8> {
        let mut v: Vec<u8> = (0..64 * BS - 1000).map(|i| (i / 97) as u8 | 1).collect();
        v[20 * BS..30 * BS].fill(0);
        v
    }

    /// The record of a `Mem` image: no file, no export.
    fn record(size: u64) -> Option<Vec<u8>> {
        let r = Record {
            size,
            map: None,
            remote: vec![],
            files: vec![],
        };
        Some(r.to_text().into_bytes())
    }

    /// [`update_map`] into memory: the update, and the bytes it wrote.
    fn update_into(src: Arc<Mem>, base: &Base<'_>, verify: bool) -> io::Result<(Updated, Vec<u8>)> {
        let mut out = io::Cursor::new(Vec::new());
        let job = job();
        let name = "mem".as_ref();
        let up = update_map(src, name, base, "b", verify, &job, &mut |_| {}, &mut out)?;
        Ok((up, out.into_inner()))
    }

    fn update(old: &[u8], new: Mem) -> (io::Result<(Updated, Map)>, Arc<Mem>) {
        let base_map = map_of(old).with_identity(record(old.len() as u64)).unwrap();
        let base = Base {
            map: &base_map,
            name: "old.map",
        };
        let src = Arc::new(new);
        let r = update_into(src.clone(), &base, false)
            .map(|(up, bytes)| (up, Map::from_bytes(&bytes).unwrap()));
        (r, src)
    }

    #[test]
    fn the_dirty_blocks_and_the_base_make_the_full_map() {
        let old = image();
        let mut new = old.clone();
        // Data rewritten, data zeroed, zeros written, the short tail.
        new[3 * BS + 10..3 * BS + 600].fill(7);
        new[40 * BS..42 * BS].fill(0);
        new[25 * BS + 512..25 * BS + 1024].fill(3);
        let end = new.len();
        new[end - 10] = 0xee;
        let dirty = vec![
            3 * BS as u64..3 * BS as u64 + 1024,
            25 * BS as u64 + 512..25 * BS as u64 + 1024,
            40 * BS as u64..42 * BS as u64,
            end as u64 - 512..end as u64,
        ];
        let full = map_of(&new);
        let (r, src) = update(&old, mem(new, dirty));
        let (up, map) = r.unwrap();
        assert_eq!(map, full);
        // Byte for byte the full map with the record it carries.
        let recorded = full.clone().with_identity(record(full.size())).unwrap();
        assert!(map.to_bytes() == recorded.to_bytes());
        assert_eq!(map.identity(), record(full.size()).as_deref());
        assert_eq!(up.header, recorded.header());
        let names: Vec<_> = up.changes.checks.iter().map(|c| c.name()).collect();
        assert_eq!(
            names,
            [
                "size",
                "parameters",
                "files",
                "bitmap",
                "allocation",
                "samples"
            ]
        );
        assert_eq!(up.changes.dirty_blocks(), 5);
        assert_eq!(up.sampled, SAMPLES);
        // The dirty blocks (one short) and the samples, nothing else.
        let read = src.read.load(Ordering::Relaxed);
        assert_eq!(read, up.read_bytes);
        assert!(read <= (5 + SAMPLES) * BS as u64, "{read}");
        let again = verify(src, map.pieces(), &job(), &mut |_| {}).unwrap();
        assert!(again.differ.is_empty());
    }

    #[test]
    fn a_write_the_bitmap_missed_is_found_by_the_samples_or_verify() {
        let old = image();
        let mut new = old.clone();
        // Block 0 is always sampled: a change there the bitmap missed.
        new[100] ^= 1;
        let e = update(&old, mem(new.clone(), vec![]))
            .0
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("old.map is not its map") && e.contains("block 0"),
            "{e}"
        );
        // Elsewhere, only --verify is sure to see it.
        let mut new = old.clone();
        new[33 * BS + 5] ^= 1;
        let (r, src) = update(&old, mem(new, vec![]));
        match r {
            Ok((_, map)) => {
                let differ = verify(src, map.pieces(), &job(), &mut |_| {})
                    .unwrap()
                    .differ;
                let at = 33 * BS as u64;
                assert_eq!(
                    differ,
                    [blkmap::Range {
                        offset: at,
                        len: BS as u64
                    }]
                );
            }
            // Sampled after all: refused as above.
            Err(e) => assert!(e.to_string().contains("block 33 "), "{e}"),
        }
    }

    #[test]
    fn a_disabled_bitmap_another_size_or_parameters_are_refused() {
        let old = image();
        let mem = |data: Vec<u8>, enabled| Mem {
            enabled,
            ..mem(data, vec![])
        };
        let e = update(&old, mem(old.clone(), false)).0.unwrap_err();
        assert!(e.to_string().contains("'b' is disabled"), "{e}");
        let mut longer = old.clone();
        longer.extend_from_slice(&[0; 512]);
        let e = update(&old, mem(longer, true)).0.unwrap_err();
        assert!(e.to_string().contains("not its earlier map"), "{e}");
        let base_map = Map::compute(blkhash::Options::new().block_size(512), &old).unwrap();
        let base = Base {
            map: &base_map,
            name: "old.map",
        };
        let src = Arc::new(mem(old.clone(), true));
        let e = update_into(src, &base, false).unwrap_err();
        assert!(
            e.to_string()
                .contains("old.map: a map of sha256 digests of 512-byte blocks"),
            "{e}"
        );
    }

    /// Old and new images differing in `blocks` (new bytes) with an empty
    /// bitmap: the error, or the update.
    fn unmarked_change(old: &[u8], new: Vec<u8>) -> io::Result<(Updated, Map)> {
        update(old, mem(new, vec![])).0
    }

    #[test]
    fn allocation_that_contradicts_the_base_is_read() {
        let old = image();
        // Written into a hole of OLD before the bitmap existed.
        let mut new = old.clone();
        new[25 * BS + 100] = 1;
        let e = unmarked_change(&old, new).unwrap_err().to_string();
        assert!(
            e.contains(
                "1 range changed since old.map without bitmap 'b' marking them: 102400+4096"
            ) && e.contains("allocation"),
            "{e}"
        );
        // Cut off (a shrink and grow): data of OLD now a hole (blocks no
        // sample reads: samples_are_clean_blocks_data_first).
        let mut new = old.clone();
        new[44 * BS..46 * BS].fill(0);
        let e = unmarked_change(&old, new).unwrap_err().to_string();
        assert!(e.contains(": 180224+8192;"), "{e}");
        // Allocated zeros where OLD has zero blocks (a preallocated
        // image): read, found equal, the update goes on.
        let pre = Mem {
            preallocated: true,
            ..mem(old.clone(), vec![])
        };
        let (r, src) = update(&old, pre);
        let (up, map) = r.unwrap();
        assert_eq!(up.conflicting, 10);
        assert_eq!(map, map_of(&old));
        assert!(src.read.load(Ordering::Relaxed) >= 10 * BS as u64);
    }

    #[test]
    fn a_base_without_a_record_needs_verify() {
        let old = image();
        let base_map = map_of(&old);
        let base = Base {
            map: &base_map,
            name: "old.map",
        };
        let src = Arc::new(mem(old.clone(), vec![]));
        let e = update_into(src.clone(), &base, false).unwrap_err();
        assert!(
            e.to_string().contains("records nothing of the image"),
            "{e}"
        );
        let before = src.read.load(Ordering::Relaxed);
        let (up, _) = update_into(src.clone(), &base, true).unwrap();
        let names: Vec<_> = up.changes.checks.iter().map(|c| c.name()).collect();
        assert_eq!(
            names,
            [
                "size",
                "parameters",
                "bitmap",
                "allocation",
                "samples",
                "verify"
            ]
        );
        // What the verification read counts: the image's data (54 blocks
        // less the short last block's 1000 bytes) and the samples.
        let read = src.read.load(Ordering::Relaxed) - before;
        assert_eq!(read, up.read_bytes);
        assert!(read >= (54 * BS - 1000) as u64, "{read}");
    }

    #[test]
    fn range_sets() {
        let a = vec![0..4, 6..10];
        let b = vec![2..7, 9..12];
        assert_eq!(union(&a, &b), vec![0..12_u64]);
        assert_eq!(intersect(&a, &b), [2..4, 6..7, 9..10]);
        assert_eq!(subtract(&a, &b), [0..2, 7..9]);
        assert_eq!(subtract(&b, &a), [4..6, 10..12]);
        assert!(intersect(&a, &[]).is_empty());
    }

    #[test]
    fn samples_are_clean_blocks_data_first() {
        let old = image();
        let base = map_of(&old);
        let bitmap = BitmapInfo {
            name: "b".into(),
            granularity: None,
            in_use: None,
            enabled: None,
        };
        let changes = Changes {
            bitmap,
            blocks: std::iter::once(0..10).collect(),
            dirty_bytes: 0,
            checks: vec![],
        };
        let s = samples(&base, &changes).unwrap();
        assert_eq!(s.len(), SAMPLES as usize);
        assert!(
            s.iter().all(|&i| i >= 10 && !(20..30).contains(&i)),
            "{s:?}"
        );
        // All dirty but 3 blocks: those 3.
        let changes = Changes {
            blocks: vec![0..30, 33..64],
            ..changes
        };
        assert_eq!(samples(&base, &changes).unwrap(), [30, 31, 32]);
    }
}
