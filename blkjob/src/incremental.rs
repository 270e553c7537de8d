//! Incremental maps: the map of an image now, from its map at an earlier
//! point (the base) and a dirty bitmap QEMU kept since that point, reading
//! only the blocks the bitmap marks. The construction is an ordered digest
//! of block digests, so the clean blocks' digests taken from the base and
//! the dirty ones hashed again give the whole checksum exactly.
//!
//! What keeps a wrong bitmap from giving a wrong checksum:
//! - a bitmap QEMU marks in use (inconsistent) is refused by the source;
//! - a disabled bitmap is refused here: it stopped recording when it was
//!   disabled, so a block written since would be taken from the base
//!   (libvirt disables a checkpoint's bitmap when it makes the next one:
//!   merge it with the newer ones into an enabled bitmap first);
//! - the base must be of the image's size, digest and block size, and
//!   [`SAMPLES`] clean blocks, spread over the image (data blocks first:
//!   they tell more), are read and must hold what the base says;
//! - a backing file written after the base was saved is refused: the
//!   bitmap records writes to the image that holds it, never to the files
//!   below it;
//! - [`verify`] reads every clean block too: the audit, and the tests'
//!   oracle.

use crate::state::block_matches;
use crate::{Job, hasher, read_all};
use blkimage::{BitmapInfo, Input, Masked, Source};
use blkmap::{Block, Map};
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

/// Clean blocks re-read to check the base, at least (fewer only in an
/// image with fewer clean blocks).
pub const SAMPLES: u64 = 16;

/// The base an update starts from: a map, and the name and time it was
/// saved under, for messages and the backing-file check.
pub struct Base<'a> {
    /// The map of the image when the bitmap was created or last cleared.
    pub map: &'a Map,
    /// Its name, as the user gave it.
    pub name: &'a str,
    /// When it was saved (its file's modification time), if known.
    pub saved: Option<SystemTime>,
}

impl<'a> Base<'a> {
    /// The base `map` loaded from the file `path`.
    pub fn of_file(map: &'a Map, path: &'a Path, name: &'a str) -> Base<'a> {
        let saved = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        Base { map, name, saved }
    }
}

/// What a bitmap says changed, in blocks of the base's size.
#[derive(Clone, Debug)]
pub struct Changes {
    /// The bitmap, as the source described it.
    pub bitmap: BitmapInfo,
    /// Dirty block indexes: in order, merged.
    pub blocks: Vec<Range<u64>>,
    /// Bytes the bitmap marks dirty (before widening to blocks).
    pub dirty_bytes: u64,
}

impl Changes {
    /// Blocks to hash again.
    pub fn dirty_blocks(&self) -> u64 {
        self.blocks.iter().map(|r| r.end - r.start).sum()
    }

    /// The dirty blocks as byte ranges of an image of `size` bytes.
    pub fn byte_ranges(&self, block_size: usize, size: u64) -> Vec<Range<u64>> {
        let bs = block_size as u64;
        (self.blocks.iter())
            .map(|r| r.start * bs..(r.end * bs).min(size))
            .filter(|r| r.start < r.end)
            .collect()
    }

    /// Whether block `i` is dirty.
    pub fn is_dirty(&self, i: u64) -> bool {
        let k = self.blocks.partition_point(|r| r.end <= i);
        self.blocks.get(k).is_some_and(|r| r.start <= i)
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// What bitmap `name` of `src` says changed since `base`, once the base is
/// known to fit: same size, no backing file written since it was saved,
/// an enabled bitmap (or one whose state the source does not say).
pub fn changes(src: &dyn Source, base: &Base<'_>, name: &str) -> io::Result<Changes> {
    let size = src.size();
    if base.map.size() != size {
        return Err(invalid(format!(
            "{} is the map of a {}-byte image and this one is {size} bytes: not its earlier map",
            base.name,
            base.map.size()
        )));
    }
    if let Some(saved) = base.saved {
        for f in src.backing_files() {
            let written = std::fs::metadata(&f).and_then(|m| m.modified());
            if written.is_ok_and(|w| w > saved) {
                return Err(invalid(format!(
                    "its backing file {} was written after {} was saved, and a dirty bitmap \
                     records writes to the image that holds it only: make a full map",
                    f.display(),
                    base.name
                )));
            }
        }
    }
    let dirty = dirty(src, name)?;
    Ok(Changes {
        blocks: dirty.blocks(base.map.block_size()),
        dirty_bytes: dirty.bytes(),
        bitmap: dirty.bitmap,
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

/// Clean block indexes to sample: [`SAMPLES`] spread over the clean data
/// blocks of the base, then, if there are fewer, over all clean blocks.
fn samples(base: &Map, changes: &Changes) -> Vec<u64> {
    let clean = |i: &u64| !changes.is_dirty(*i);
    let data: Vec<u64> = (base.runs())
        .filter(|r| r.digests.is_some())
        .flat_map(|r| r.first..r.first + r.count)
        .filter(clean)
        .collect();
    let mut picked = spread(&data, SAMPLES as usize);
    if picked.len() < SAMPLES as usize {
        let rest: Vec<u64> = (0..base.blocks())
            .filter(clean)
            .filter(|i| !picked.contains(i))
            .take(1 << 20)
            .collect();
        picked.extend(spread(&rest, SAMPLES as usize - picked.len()));
        picked.sort_unstable();
    }
    picked
}

/// `n` of `items`, spread evenly (all of them if there are fewer).
fn spread(items: &[u64], n: usize) -> Vec<u64> {
    if items.len() <= n {
        return items.to_vec();
    }
    (0..n).map(|k| items[k * items.len() / n]).collect()
}

/// Read the sampled clean blocks of `src` and check each holds what the
/// base says; the bytes read. A block that does not: the base is not this
/// image's earlier map, or the image changed behind the bitmap's back.
pub fn check_clean(src: &dyn Source, base: &Base<'_>, changes: &Changes) -> io::Result<u64> {
    let map = base.map;
    let bs = map.block_size() as u64;
    let mut buf = vec![0u8; bs as usize];
    let mut read = 0;
    for i in samples(map, changes) {
        let offset = i * bs;
        let n = bs.min(map.size() - offset) as usize;
        src.read_at(&mut buf[..n], offset)?;
        read += n as u64;
        let recorded = match map.block(i) {
            Some(Block::Data(d)) => Some(d),
            _ => None,
        };
        if !block_matches(map.algorithm(), &buf[..n], recorded) {
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

/// An incremental map, and what it took.
#[derive(Debug)]
pub struct Updated {
    /// The image's map now, byte for byte the map a full run would make.
    pub map: Map,
    /// "qcow2", "raw" (an NBD export), ...
    pub format: String,
    /// What the bitmap said.
    pub changes: Changes,
    /// Clean blocks re-read to check the base.
    pub sampled: u64,
    /// Bytes read from the image: the dirty blocks' data and the samples.
    pub read_bytes: u64,
}

/// The map of `src` now, from `base` and the dirty bitmap `bitmap`: the
/// base checked ([`changes`], [`check_clean`]), then only the dirty blocks
/// read and hashed, as `job` says (its digest and block size must be the
/// base's). `progress` gets the bytes passed on, the clean ones included.
///
/// ```no_run
/// use blkjob::incremental::{Base, update_map};
/// let old = blkmap::Map::load("disk.map").unwrap();
/// let job = blkjob::JobSpec::default()
///     .resolve(Some((old.algorithm(), old.block_size())))
///     .unwrap();
/// let src = blkjob::seekable(job.open("disk.qcow2").unwrap(), "an update").unwrap();
/// let base = Base::of_file(&old, "disk.map".as_ref(), "disk.map");
/// let new = update_map(src, &base, "nightly", &job, &mut |_| {}).unwrap();
/// new.map.save("disk.map").unwrap();
/// println!("{}  disk.qcow2", new.map.checksum());
/// ```
pub fn update_map(
    src: Arc<dyn Source>,
    base: &Base<'_>,
    bitmap: &str,
    job: &Job,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Updated> {
    if let Some(why) = crate::map_mismatch(base.map, job.algorithm(), job.block_size()) {
        return Err(invalid(format!("{}: {why}", base.name)));
    }
    let changes = changes(&*src, base, bitmap)?;
    // The samples are read while the dirty blocks are hashed (nothing is
    // written before both are done): their seeks then cost no time.
    let (sampled_bytes, hashed) = std::thread::scope(|s| {
        let check = s.spawn(|| check_clean(&*src, base, &changes));
        let hashed = hash_dirty(src.clone(), &changes, job, progress);
        let sampled = check
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (sampled, hashed)
    });
    // A base that is not the image's is the error to report first: it
    // says why the rest is wrong.
    let sampled_bytes = sampled_bytes?;
    let (fresh, read) = hashed?;
    let map = base.map.splice_part(&fresh, &changes.blocks)?;
    Ok(Updated {
        map,
        format: read.format,
        sampled: samples(base.map, &changes).len() as u64,
        read_bytes: read.stats.data + sampled_bytes,
        changes,
    })
}

/// Hash the dirty blocks of `src` alone (every other range a hole to the
/// reader, never read): a part covering the image whose dirty blocks are
/// the image's.
fn hash_dirty(
    src: Arc<dyn Source>,
    changes: &Changes,
    job: &Job,
    progress: &mut dyn FnMut(u64),
) -> io::Result<(blkmap::Part, blkimage::InputRead)> {
    let size = src.size();
    let visible = changes.byte_ranges(job.block_size(), src.size());
    let masked = Masked::new(src, visible)?;
    let (sink, builder) = hasher(job)?;
    let input = Input::Image(Box::new(masked));
    read_all(input, sink, job, job.cancel(), progress, |sink| {
        builder.finalize_part(sink, size, 0)
    })
}

/// [`verify`], as an error naming the ranges (the first 8) when any
/// differ: what `--verify` and Python's `verify=True` report, before
/// anything is written.
pub fn check_verified(
    src: Arc<dyn Source>,
    updated: &Map,
    base: &Base<'_>,
    bitmap: &str,
    job: &Job,
    progress: &mut dyn FnMut(u64),
) -> io::Result<()> {
    let differ = verify(src, updated, job, progress)?;
    if differ.is_empty() {
        return Ok(());
    }
    let shown: Vec<String> = (differ.iter().take(8))
        .map(|r| format!("{}+{}", r.offset, r.len))
        .collect();
    let more = if differ.len() > 8 { ", ..." } else { "" };
    Err(invalid(format!(
        "{} ranges changed since {} without bitmap '{bitmap}' marking them: {}{more}; \
         nothing written",
        differ.len(),
        base.name,
        shown.join(", ")
    )))
}

/// Read all of `src` and compare with `updated` (its incremental map):
/// the block ranges that differ, each a block the bitmap did not mark
/// whose content changed (a bitmap that missed a write, or a base that is
/// not the image's). Empty when the incremental map is the image's.
pub fn verify(
    src: Arc<dyn Source>,
    updated: &Map,
    job: &Job,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Vec<blkmap::Range>> {
    let size = src.size();
    let whole = blkimage::Window::new(src, 0, size)?;
    let full = crate::map(Input::Image(Box::new(whole)), job, job.cancel(), progress)?;
    let diff = blkmap::diff(updated, &full.map).map_err(|e| invalid(e.to_string()))?;
    Ok(diff.ranges)
}

#[cfg(test)]
mod tests {
    use super::*;
    use blkimage::{Dirty, Extent, ExtentKind};
    use std::sync::atomic::{AtomicU64, Ordering};

    const BS: usize = 4096;

    /// An image in memory with one dirty bitmap, counting bytes read.
    struct Mem {
        data: Vec<u8>,
        dirty: Vec<Range<u64>>,
        enabled: bool,
        read: AtomicU64,
    }

    impl Source for Mem {
        fn format(&self) -> &str {
            "mem"
        }
        fn size(&self) -> u64 {
            self.data.len() as u64
        }
        fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
            let kind = ExtentKind::Data;
            Ok(vec![Extent { offset, len, kind }])
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

    fn update(old: &[u8], new: Mem) -> (io::Result<Updated>, Arc<Mem>) {
        let base_map = map_of(old);
        let base = Base {
            map: &base_map,
            name: "old.map",
            saved: None,
        };
        let src = Arc::new(new);
        let r = update_map(src.clone(), &base, "b", &job(), &mut |_| {});
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
        let mem = Mem {
            data: new,
            dirty,
            enabled: true,
            read: AtomicU64::new(0),
        };
        let (r, src) = update(&old, mem);
        let up = r.unwrap();
        assert_eq!(up.map, full);
        assert_eq!(up.map.to_bytes(), full.to_bytes());
        assert_eq!(up.changes.dirty_blocks(), 5);
        assert_eq!(up.sampled, SAMPLES);
        // The dirty blocks (one short) and the samples, nothing else.
        let read = src.read.load(Ordering::Relaxed);
        assert_eq!(read, up.read_bytes);
        assert!(read <= (5 + SAMPLES) * BS as u64, "{read}");
        let again = verify(src, &up.map, &job(), &mut |_| {}).unwrap();
        assert!(again.is_empty());
    }

    #[test]
    fn a_write_the_bitmap_missed_is_found_by_the_samples_or_verify() {
        let old = image();
        let mut new = old.clone();
        // Block 0 is always sampled: a change there the bitmap missed.
        new[100] ^= 1;
        let mem = Mem {
            data: new.clone(),
            dirty: vec![],
            enabled: true,
            read: AtomicU64::new(0),
        };
        let e = update(&old, mem).0.unwrap_err().to_string();
        assert!(
            e.contains("old.map is not its map") && e.contains("block 0"),
            "{e}"
        );
        // Elsewhere, only --verify is sure to see it.
        let mut new = old.clone();
        new[33 * BS + 5] ^= 1;
        let mem = Mem {
            data: new,
            dirty: vec![],
            enabled: true,
            read: AtomicU64::new(0),
        };
        let (r, src) = update(&old, mem);
        match r {
            Ok(up) => {
                let differ = verify(src, &up.map, &job(), &mut |_| {}).unwrap();
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
            data,
            dirty: vec![],
            enabled,
            read: AtomicU64::new(0),
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
            saved: None,
        };
        let src = Arc::new(mem(old.clone(), true));
        let e = update_map(src, &base, "b", &job(), &mut |_| {}).unwrap_err();
        assert!(
            e.to_string()
                .contains("old.map: a map of sha256 digests of 512-byte blocks"),
            "{e}"
        );
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
        };
        let s = samples(&base, &changes);
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
        assert_eq!(samples(&base, &changes), [30, 31, 32]);
    }
}
