//! QEMU's persistent dirty bitmaps in a qcow2 image (docs/interop/qcow2.txt,
//! "Bitmaps"): the directory the bitmaps extension points at, and one
//! bitmap's table and data, turned into merged byte ranges.
//!
//! Everything is checked as QEMU checks it when it loads bitmaps
//! (block/qcow2-bitmap.c), with its limits, so that memory stays bounded on
//! a hostile image: the directory is at most 64 MiB and inside the file, a
//! table at most 512 MiB of bitmap data ([`MAX_PHYS_BYTES`]), read a chunk
//! of entries at a time, and the data a cluster at a time.
//!
//! Only the file that holds the bitmaps is read: a bitmap records the
//! writes to its own image (not its backing file's), and it lives in the
//! qcow2 file even when guest data is in an external data file.

use super::header::{BitmapsExt, MAX_BITMAP_DIRECTORY_BYTES, MAX_BITMAPS};
use super::invalid;
use super::storage::Storage;
use crate::bitmap::RangeBuilder;
use crate::{BitmapInfo, Dirty};
use std::io;
use std::ops::Range;

/// QEMU's limits (BME_MAX_TABLE_SIZE, BME_MAX_PHYS_SIZE, granularity bits,
/// BME_MAX_NAME_SIZE).
const MAX_TABLE_ENTRIES: u64 = 0x800_0000;
/// Bytes of bitmap data a table may address: QEMU keeps a bitmap in memory.
pub const MAX_PHYS_BYTES: u64 = 0x2000_0000;
const MIN_GRANULARITY_BITS: u8 = 9;
const MAX_GRANULARITY_BITS: u8 = 31;
const MAX_NAME_LEN: usize = 1023;

/// The fixed part of a directory entry.
const ENTRY_HEADER_LEN: usize = 24;

/// Directory entry flags.
const FLAG_IN_USE: u32 = 1 << 0;
const FLAG_AUTO: u32 = 1 << 1;
const FLAG_EXTRA_DATA_COMPATIBLE: u32 = 1 << 2;
const FLAGS_KNOWN: u32 = FLAG_IN_USE | FLAG_AUTO | FLAG_EXTRA_DATA_COMPATIBLE;

/// The one bitmap type: dirty tracking.
const TYPE_DIRTY_TRACKING: u8 = 1;

/// Bitmap table entries: bits 1-8 and 56-63 reserved, 9-55 the offset of a
/// data cluster, bit 0 "all ones" when the offset is 0.
const TABLE_RESERVED: u64 = 0xff00_0000_0000_01fe;
const TABLE_OFFSET: u64 = 0x00ff_ffff_ffff_fe00;
const TABLE_ALL_ONES: u64 = 1;

/// Table entries read at once (32 KiB).
const TABLE_CHUNK: usize = 4096;

/// A directory entry, checked.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    name: String,
    table_offset: u64,
    table_size: u32,
    flags: u32,
    granularity_bits: u8,
}

impl Entry {
    fn granularity(&self) -> u64 {
        1 << self.granularity_bits
    }

    /// As [`BitmapInfo`]: in use when QEMU says so, or when the whole
    /// extension is inconsistent (`consistent` false), since QEMU then
    /// trusts none of the bitmaps.
    fn info(&self, consistent: bool) -> BitmapInfo {
        BitmapInfo {
            name: self.name.clone(),
            granularity: Some(self.granularity()),
            in_use: Some(!consistent || self.flags & FLAG_IN_USE != 0),
            enabled: Some(self.flags & FLAG_AUTO != 0),
        }
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A directory error.
fn broken(msg: String) -> io::Error {
    invalid(format!("bitmap directory: {msg}"))
}

/// An error about bitmap `name`.
fn bad(name: &str, msg: String) -> io::Error {
    invalid(format!("dirty bitmap '{name}': {msg}"))
}

/// The bitmap directory `ext` points at in `file` (clusters of
/// `cluster_size` bytes), every entry checked.
pub(super) fn directory(
    file: &dyn Storage,
    ext: &BitmapsExt,
    cluster_size: u64,
) -> io::Result<Vec<Entry>> {
    let &BitmapsExt {
        count,
        directory_size: size,
        directory_offset: offset,
        ..
    } = ext;
    // The header checked these when the extension is consistent; not
    // otherwise, and a listing still reads it then.
    if count == 0 || count > MAX_BITMAPS {
        return Err(broken(format!(
            "{count} bitmaps (QEMU allows 1 to {MAX_BITMAPS})"
        )));
    }
    if size == 0 || size > MAX_BITMAP_DIRECTORY_BYTES {
        return Err(broken(format!(
            "{size} bytes (QEMU allows 1 to {MAX_BITMAP_DIRECTORY_BYTES})"
        )));
    }
    if offset & (cluster_size - 1) != 0 {
        return Err(broken(format!(
            "offset {offset:#x} is not aligned to the cluster size"
        )));
    }
    if offset == 0 || offset.checked_add(size).is_none_or(|e| e > file.len()) {
        return Err(broken(format!(
            "{size} bytes at offset {offset:#x} are outside the file"
        )));
    }
    let mut dir = vec![0u8; size as usize];
    file.read_exact_at(&mut dir, offset)?;

    let mut entries: Vec<Entry> = Vec::new();
    let mut at = 0usize;
    while at < dir.len() {
        let n = entries.len() + 1;
        if entries.len() == count as usize {
            return Err(broken(format!(
                "more entries than the {count} the header says"
            )));
        }
        let e = parse_entry(&dir[at..], n, cluster_size)?;
        if entries.iter().any(|o| o.name == e.name) {
            return Err(broken(format!("two bitmaps named '{}'", e.name)));
        }
        at += entry_len(&dir[at..]);
        entries.push(e);
    }
    if entries.len() != count as usize {
        return Err(broken(format!(
            "{} entries, not the {count} the header says",
            entries.len()
        )));
    }
    Ok(entries)
}

/// Bytes of the entry at the start of `rest` (checked by [`parse_entry`]).
fn entry_len(rest: &[u8]) -> usize {
    let name_len = usize::from(be16(rest, 18));
    let extra_len = be32(rest, 20) as usize;
    (ENTRY_HEADER_LEN + name_len + extra_len).next_multiple_of(8)
}

/// Entry `n` (from 1) at the start of `rest`, the directory's remaining bytes.
fn parse_entry(rest: &[u8], n: usize, cluster_size: u64) -> io::Result<Entry> {
    let past = || broken(format!("entry {n} runs past the end of the directory"));
    if rest.len() < ENTRY_HEADER_LEN {
        return Err(past());
    }
    let table_offset = be64(rest, 0);
    let table_size = be32(rest, 8);
    let flags = be32(rest, 12);
    let kind = rest[16];
    let granularity_bits = rest[17];
    let name_len = usize::from(be16(rest, 18));
    // u64: a u32 extra size plus the rest cannot overflow it.
    let extra_len = u64::from(be32(rest, 20));
    let len = (ENTRY_HEADER_LEN as u64 + name_len as u64 + extra_len).next_multiple_of(8);
    if len > rest.len() as u64 {
        return Err(past());
    }
    if name_len == 0 {
        return Err(broken(format!("entry {n} has an empty name")));
    }
    if name_len > MAX_NAME_LEN {
        return Err(broken(format!(
            "entry {n} has a name of {name_len} bytes (QEMU allows {MAX_NAME_LEN})"
        )));
    }
    let name_at = ENTRY_HEADER_LEN + extra_len as usize;
    let name = std::str::from_utf8(&rest[name_at..name_at + name_len])
        .map_err(|_| broken(format!("the name of entry {n} is not UTF-8")))?
        .to_string();
    let err = |msg: String| Err(bad(&name, msg));
    if kind != TYPE_DIRTY_TRACKING {
        return err(format!(
            "type {kind}, not a dirty tracking bitmap ({TYPE_DIRTY_TRACKING})"
        ));
    }
    if flags & !FLAGS_KNOWN != 0 {
        return err(format!("unknown flags {:#x}", flags & !FLAGS_KNOWN));
    }
    if extra_len != 0 && flags & FLAG_EXTRA_DATA_COMPATIBLE == 0 {
        return err(format!(
            "{extra_len} bytes of extra data that only a newer program may ignore (extra_data_compatible is clear)"
        ));
    }
    if !(MIN_GRANULARITY_BITS..=MAX_GRANULARITY_BITS).contains(&granularity_bits) {
        return err(format!(
            "granularity_bits {granularity_bits} out of range ({MIN_GRANULARITY_BITS} to {MAX_GRANULARITY_BITS})"
        ));
    }
    if table_offset == 0 || table_offset & (cluster_size - 1) != 0 {
        return err(format!(
            "bitmap table offset {table_offset:#x} is not a cluster of the file (zero or not aligned to the cluster size)"
        ));
    }
    if table_size == 0
        || u64::from(table_size) > MAX_TABLE_ENTRIES
        || u64::from(table_size) * cluster_size > MAX_PHYS_BYTES
    {
        return err(format!(
            "bitmap table of {table_size} entries (QEMU allows 1 to {} with {cluster_size}-byte clusters)",
            MAX_TABLE_ENTRIES.min(MAX_PHYS_BYTES / cluster_size)
        ));
    }
    Ok(Entry {
        name,
        table_offset,
        table_size,
        flags,
        granularity_bits,
    })
}

/// `e`, a directory error, explained when the extension is inconsistent:
/// a program without bitmap support may have reused the clusters.
fn unreadable(ext: &BitmapsExt, e: io::Error) -> io::Error {
    if ext.consistent {
        return e;
    }
    io::Error::new(
        e.kind(),
        format!(
            "{e} (the bitmaps are inconsistent anyway: a program without bitmap support \
             wrote to the image, the bitmaps extension's autoclear bit is clear)"
        ),
    )
}

/// The bitmaps of the image whose header has `ext` (none without it).
pub(super) fn list(
    file: &dyn Storage,
    ext: Option<&BitmapsExt>,
    cluster_size: u64,
) -> io::Result<Vec<BitmapInfo>> {
    let Some(ext) = ext else {
        return Ok(Vec::new());
    };
    Ok(directory(file, ext, cluster_size)
        .map_err(|e| unreadable(ext, e))?
        .iter()
        .map(|e| e.info(ext.consistent))
        .collect())
}

/// The ranges bitmap `name` marks dirty in an image of `size` bytes whose
/// header has `ext`, refused when the bitmap is missing, inconsistent, or
/// malformed.
pub(super) fn dirty(
    file: &dyn Storage,
    ext: Option<&BitmapsExt>,
    cluster_size: u64,
    size: u64,
    name: &str,
) -> io::Result<Dirty> {
    let not_found = |names: &[Entry]| {
        let has = if names.is_empty() {
            "the image has none".to_string()
        } else {
            let names: Vec<&str> = names.iter().map(|e| e.name.as_str()).collect();
            format!("the image has: {}", names.join(", "))
        };
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no dirty bitmap '{name}' ({has})"),
        )
    };
    let Some(ext) = ext else {
        return Err(not_found(&[]));
    };
    let entries = directory(file, ext, cluster_size).map_err(|e| unreadable(ext, e))?;
    let Some(entry) = entries.iter().find(|e| e.name == name) else {
        return Err(not_found(&entries));
    };
    if !ext.consistent {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "dirty bitmap '{name}' is inconsistent: a program without bitmap support \
                 wrote to the image (the bitmaps extension's autoclear bit is clear), so \
                 the bitmap may miss writes (QEMU drops such bitmaps)"
            ),
        ));
    }
    if entry.flags & FLAG_IN_USE != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "dirty bitmap '{name}' is in use: QEMU has the image open for writing, or \
                 did not close it cleanly after opening it so, and the bitmap may miss \
                 writes (QEMU calls it inconsistent). While a VM or qemu-storage-daemon \
                 runs, read a frozen copy of the bitmap from it over NBD instead: the \
                 running-VM recipe of blkhash's guide (incremental.md; with libvirt, \
                 libvirt.md)"
            ),
        ));
    }
    let ranges = read_ranges(file, entry, cluster_size, size)?;
    Ok(Dirty {
        bitmap: entry.info(true),
        ranges,
    })
}

/// Dirty byte ranges, built merged (and bounded) as granules come.
struct Ranges {
    granularity: u64,
    size: u64,
    out: RangeBuilder,
}

impl Ranges {
    /// Granules `first..end` (`first` inside the image) are dirty.
    fn add(&mut self, first: u64, end: u64) {
        // end <= ceil(size / granularity): the products stay below
        // size + granularity, which fits (the header bounds the size).
        let start = first * self.granularity;
        let end = (end * self.granularity).min(self.size);
        self.out.push(start, end);
    }

    /// The dirty granules among the first `count` bits of `data` (granule
    /// `i` is bit `i % 8` of byte `i / 8`, least significant first, as QEMU
    /// serializes its bitmaps), `first` the granule of bit 0.
    fn add_bits(&mut self, data: &[u8], first: u64, count: u64) {
        for (k, chunk) in data.chunks(8).enumerate() {
            let base = k as u64 * 64;
            if base >= count {
                break;
            }
            let mut bytes = [0u8; 8];
            bytes[..chunk.len()].copy_from_slice(chunk);
            // Little endian: bit j of the word is granule base + j.
            let mut word = u64::from_le_bytes(bytes);
            if count - base < 64 {
                word &= (1u64 << (count - base)) - 1;
            }
            // Each turn takes a run of ones and clears it: this ends.
            while word != 0 {
                let start = word.trailing_zeros();
                let ones = (!(word >> start)).trailing_zeros();
                let end = start + ones;
                self.add(
                    first + base + u64::from(start),
                    first + base + u64::from(end),
                );
                if end >= 64 {
                    break;
                }
                word &= !((1u64 << end) - 1);
            }
        }
    }
}

/// The dirty ranges of `entry`, a bitmap of an image of `size` bytes: its
/// table checked entry by entry, its data read a cluster at a time.
fn read_ranges(
    file: &dyn Storage,
    entry: &Entry,
    cluster_size: u64,
    size: u64,
) -> io::Result<Vec<Range<u64>>> {
    let name = entry.name.as_str();
    let granularity = entry.granularity();
    let bits = size.div_ceil(granularity);
    let per_cluster = cluster_size * 8;
    let needed = bits.div_ceil(per_cluster);
    if u64::from(entry.table_size) != needed {
        return Err(bad(
            name,
            format!(
                "its table of {} entries does not cover the image's size ({size} bytes at a granularity of {granularity} need {needed})",
                entry.table_size
            ),
        ));
    }
    let table_bytes = u64::from(entry.table_size) * 8;
    if entry
        .table_offset
        .checked_add(table_bytes)
        .is_none_or(|e| e > file.len())
    {
        return Err(bad(
            name,
            format!(
                "its table ({} entries at offset {:#x}) is beyond the end of the file",
                entry.table_size, entry.table_offset
            ),
        ));
    }
    let mut ranges = Ranges {
        granularity,
        size,
        out: RangeBuilder::new(size),
    };
    let mut table = vec![0u8; TABLE_CHUNK.min(entry.table_size as usize) * 8];
    let mut data = Vec::new();
    // Data clusters seen: one shared by several entries would let a small
    // hostile file stand for a huge fragmented bitmap (QEMU never shares
    // them). At most one per table entry, 8 MiB of table at most.
    let mut seen = std::collections::HashSet::new();
    let mut i = 0u64;
    while i < needed {
        let n = (needed - i).min(TABLE_CHUNK as u64) as usize;
        let chunk = &mut table[..n * 8];
        file.read_exact_at(chunk, entry.table_offset + i * 8)?;
        for raw in chunk.chunks_exact(8) {
            let e = be64(raw, 0);
            let first = i * per_cluster;
            let count = per_cluster.min(bits - first);
            let host = e & TABLE_OFFSET;
            let what = || format!("bitmap table entry {i} ({e:#018x})");
            if e & TABLE_RESERVED != 0 {
                return Err(bad(name, format!("{} has reserved bits set", what())));
            }
            if host == 0 {
                if e & TABLE_ALL_ONES != 0 {
                    ranges.add(first, first + count);
                }
            } else {
                if e & TABLE_ALL_ONES != 0 {
                    return Err(bad(
                        name,
                        format!("{} has both a data offset and the all-ones bit", what()),
                    ));
                }
                if host & (cluster_size - 1) != 0 {
                    return Err(bad(
                        name,
                        format!("{}: data offset not aligned to the cluster size", what()),
                    ));
                }
                if !seen.insert(host) {
                    return Err(bad(
                        name,
                        format!("{}: data cluster shared with an earlier entry", what()),
                    ));
                }
                // Only the bytes holding the bitmap's bits are needed (the
                // last cluster's tail is unused).
                let len = count.div_ceil(8);
                if host.checked_add(len).is_none_or(|end| end > file.len()) {
                    return Err(bad(
                        name,
                        format!("{}: data cluster beyond the end of the file", what()),
                    ));
                }
                data.resize(len as usize, 0);
                file.read_exact_at(&mut data, host)?;
                ranges.add_bits(&data, first, count);
            }
            i += 1;
        }
    }
    Ok(ranges.out.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CS: u64 = 512;

    /// A directory entry's bytes.
    fn entry_bytes(
        name: &[u8],
        table_offset: u64,
        table_size: u32,
        flags: u32,
        gran_bits: u8,
        extra: &[u8],
    ) -> Vec<u8> {
        let mut e = Vec::new();
        e.extend(table_offset.to_be_bytes());
        e.extend(table_size.to_be_bytes());
        e.extend(flags.to_be_bytes());
        e.push(TYPE_DIRTY_TRACKING);
        e.push(gran_bits);
        e.extend((name.len() as u16).to_be_bytes());
        e.extend((extra.len() as u32).to_be_bytes());
        e.extend(extra);
        e.extend(name);
        e.resize(e.len().next_multiple_of(8), 0);
        e
    }

    /// A file of clusters: the directory from cluster 1, a table at
    /// cluster 4, data clusters from cluster 5.
    struct Image {
        file: Vec<u8>,
        ext: BitmapsExt,
    }

    const DIR: u64 = CS;
    const TABLE: u64 = 4 * CS;
    const DATA: u64 = 5 * CS;

    impl Image {
        fn new(entries: &[Vec<u8>], table: &[u64], data: &[&[u8]]) -> Image {
            let mut file = vec![0u8; (5 + data.len()) * CS as usize];
            let dir: Vec<u8> = entries.concat();
            file[DIR as usize..DIR as usize + dir.len()].copy_from_slice(&dir);
            for (i, t) in table.iter().enumerate() {
                let at = TABLE as usize + i * 8;
                file[at..at + 8].copy_from_slice(&t.to_be_bytes());
            }
            for (i, d) in data.iter().enumerate() {
                let at = (DATA + i as u64 * CS) as usize;
                file[at..at + d.len()].copy_from_slice(d);
            }
            let ext = BitmapsExt {
                count: entries.len() as u32,
                directory_size: dir.len() as u64,
                directory_offset: DIR,
                consistent: true,
            };
            Image { file, ext }
        }

        /// One bitmap "b" of granularity 512 over `size` bytes.
        fn one(size: u64, table: &[u64], data: &[&[u8]]) -> (Image, u64) {
            let n = size.div_ceil(512).div_ceil(CS * 8) as u32;
            let e = entry_bytes(b"b", TABLE, n, FLAG_AUTO, 9, &[]);
            (Image::new(&[e], table, data), size)
        }

        fn dirty(&self, size: u64, name: &str) -> io::Result<Dirty> {
            dirty(&self.file, Some(&self.ext), CS, size, name)
        }

        fn list(&self) -> io::Result<Vec<BitmapInfo>> {
            list(&self.file, Some(&self.ext), CS)
        }
    }

    fn err_text(r: io::Result<impl std::fmt::Debug>) -> String {
        r.expect_err("an error").to_string()
    }

    #[test]
    fn bits_lsb_first_merged_and_clipped() {
        // Bits 0, 1 (merged), 9, and 63..=65 (across words); size ends
        // inside granule 65.
        let mut d = vec![0u8; 16];
        d[0] = 0b11;
        d[1] = 0b10;
        d[7] = 0x80;
        d[8] = 0b11;
        let (img, size) = Image::one(65 * 512 + 100, &[DATA], &[&d]);
        let got = img.dirty(size, "b").unwrap();
        assert_eq!(got.ranges, vec![0..1024, 4608..5120, 63 * 512..size]);
        assert_eq!(got.bitmap.enabled, Some(true));
        assert_eq!(got.bitmap.in_use, Some(false));
    }

    #[test]
    fn bits_past_the_size_ignored() {
        // 3 granules: bits 3.. are set but outside.
        let (img, size) = Image::one(1536, &[DATA], &[&[0xff; 8]]);
        assert_eq!(img.dirty(size, "b").unwrap().ranges, vec![0..1536]);
    }

    #[test]
    fn all_ones_and_zero_entries() {
        // Two table entries of 4096 granules each (512-byte clusters): the
        // first all ones, the second all zeros; then a third with data.
        let size = 2 * 4096 * 512 + 1024;
        let (img, size) = Image::one(size, &[TABLE_ALL_ONES, 0, DATA], &[&[0b10]]);
        assert_eq!(
            img.dirty(size, "b").unwrap().ranges,
            vec![0..4096 * 512, 2 * 4096 * 512 + 512..size]
        );
        let (img, size) = Image::one(size, &[TABLE_ALL_ONES, TABLE_ALL_ONES, 0], &[]);
        assert_eq!(
            img.dirty(size, "b").unwrap().ranges,
            vec![0..2 * 4096 * 512]
        );
    }

    #[test]
    fn every_run_of_a_word() {
        // Alternating bits, and a word of all ones after it.
        let mut d = vec![0x55u8; 8];
        d.extend([0xff; 8]);
        let (img, size) = Image::one(128 * 512, &[DATA], &[&d]);
        let got = img.dirty(size, "b").unwrap().ranges;
        let mut want: Vec<Range<u64>> = (0..32).map(|i| i * 1024..i * 1024 + 512).collect();
        want.push(64 * 512..128 * 512);
        assert_eq!(got, want);
    }

    #[test]
    fn listing_and_missing() {
        let a = entry_bytes(b"a", TABLE, 1, FLAG_AUTO, 16, &[]);
        let b = entry_bytes(b"b", TABLE, 1, FLAG_IN_USE, 9, &[]);
        let img = Image::new(&[a, b], &[0], &[]);
        let list = img.list().unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].granularity, Some(65536));
        assert_eq!((list[0].in_use, list[0].enabled), (Some(false), Some(true)));
        assert_eq!((list[1].in_use, list[1].enabled), (Some(true), Some(false)));
        let e = img.dirty(4096, "c").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("the image has: a, b"), "{e}");
        let e = dirty(&img.file, None, CS, 4096, "c").unwrap_err();
        assert!(e.to_string().contains("the image has none"), "{e}");
        assert!(list_none());
        let t = err_text(img.dirty(4096, "b"));
        assert!(t.contains("in use") && t.contains("inconsistent"), "{t}");
    }

    fn list_none() -> bool {
        list(&Vec::new(), None, CS).unwrap().is_empty()
    }

    #[test]
    fn extension_inconsistent() {
        let (mut img, size) = Image::one(4096, &[0], &[]);
        img.ext.consistent = false;
        let t = err_text(img.dirty(size, "b"));
        assert!(t.contains("inconsistent"), "{t}");
        let mut broken = Image::one(4096, &[0], &[]).0;
        broken.ext.consistent = false;
        broken.ext.count = 2;
        let t = err_text(broken.list());
        assert!(
            t.contains("not the 2") && t.contains("inconsistent anyway"),
            "{t}"
        );
        assert_eq!(img.list().unwrap()[0].in_use, Some(true));
        assert_eq!(
            img.dirty(size, "x").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn disabled_returned() {
        let e = entry_bytes(b"b", TABLE, 1, 0, 9, &[]);
        let img = Image::new(&[e], &[TABLE_ALL_ONES], &[]);
        let d = img.dirty(1000, "b").unwrap();
        assert_eq!(d.bitmap.enabled, Some(false));
        assert_eq!(d.ranges, vec![0..1000]);
    }

    #[test]
    fn extra_data() {
        // Compatible extra data is skipped (the name follows it).
        let e = entry_bytes(b"b", TABLE, 1, FLAG_EXTRA_DATA_COMPATIBLE, 9, b"xyz");
        let img = Image::new(&[e], &[0], &[]);
        assert_eq!(img.list().unwrap()[0].name, "b");
        let e = entry_bytes(b"b", TABLE, 1, 0, 9, b"xyz");
        let t = err_text(Image::new(&[e], &[0], &[]).list());
        assert!(t.contains("extra data"), "{t}");
    }

    /// Directory entries QEMU refuses, and why.
    #[test]
    fn malformed_entries() {
        let ok = || entry_bytes(b"b", TABLE, 1, FLAG_AUTO, 9, &[]);
        let with = |at: usize, bytes: &[u8]| {
            let mut e = ok();
            e[at..at + bytes.len()].copy_from_slice(bytes);
            e
        };
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (with(16, &[2]), "type 2"),
            (with(12, &8u32.to_be_bytes()), "unknown flags 0x8"),
            (with(17, &[8]), "granularity_bits 8"),
            (with(17, &[32]), "granularity_bits 32"),
            (with(0, &(TABLE + 1).to_be_bytes()), "not aligned"),
            (with(0, &0u64.to_be_bytes()), "table offset 0x0"),
            (with(8, &0u32.to_be_bytes()), "table of 0 entries"),
            (
                with(8, &((1u32 << 20) + 1).to_be_bytes()),
                "QEMU allows 1 to 1048576",
            ),
            (with(18, &0u16.to_be_bytes()), "empty name"),
            (with(24, &[0xff]), "not UTF-8"),
            (with(18, &100u16.to_be_bytes()), "runs past"),
            (
                entry_bytes(&[b'x'; 1024], TABLE, 1, 0, 9, &[]),
                "1024 bytes",
            ),
        ];
        for (e, want) in cases {
            let t = err_text(Image::new(&[e], &[0], &[]).list());
            assert!(t.contains(want), "{want}: {t}");
        }
    }

    #[test]
    fn malformed_directory() {
        let e = entry_bytes(b"b", TABLE, 1, 0, 9, &[]);
        let two = Image::new(&[e.clone(), e.clone()], &[0], &[]);
        assert!(err_text(two.list()).contains("two bitmaps named 'b'"));
        let mut img = Image::new(std::slice::from_ref(&e), &[0], &[]);
        img.ext.count = 2;
        assert!(err_text(img.list()).contains("1 entries, not the 2"));
        let mut img = Image::new(&[e.clone(), e.clone()], &[0], &[]);
        img.ext.count = 1;
        assert!(err_text(img.list()).contains("more entries"));
        let mut img = Image::new(std::slice::from_ref(&e), &[0], &[]);
        img.ext.directory_size = 20; // a partial entry
        assert!(err_text(img.list()).contains("runs past"));
        let mut img = Image::new(std::slice::from_ref(&e), &[0], &[]);
        img.ext.directory_offset = 64 * CS;
        assert!(err_text(img.list()).contains("outside the file"));
        let mut img = Image::new(std::slice::from_ref(&e), &[0], &[]);
        img.ext.directory_offset = CS + 8;
        assert!(err_text(img.list()).contains("not aligned"));
        let mut img = Image::new(&[e], &[0], &[]);
        img.ext.directory_size = u64::MAX;
        assert!(err_text(img.list()).contains("QEMU allows"));
    }

    /// 4 KiB clusters: a data offset aligned to 512 bytes only.
    #[test]
    fn data_not_aligned() {
        let cs = 4096u64;
        let mut file = vec![0u8; 4 * cs as usize];
        let e = entry_bytes(b"b", 2 * cs, 1, 0, 9, &[]);
        file[cs as usize..cs as usize + e.len()].copy_from_slice(&e);
        let at = 2 * cs as usize;
        file[at..at + 8].copy_from_slice(&(3 * cs + 512).to_be_bytes());
        let ext = BitmapsExt {
            count: 1,
            directory_size: e.len() as u64,
            directory_offset: cs,
            consistent: true,
        };
        let t = err_text(dirty(&file, Some(&ext), cs, 4096, "b"));
        assert!(t.contains("data offset not aligned"), "{t}");
        file[at..at + 8].copy_from_slice(&(3 * cs).to_be_bytes());
        file[3 * cs as usize] = 0b100;
        let d = dirty(&file, Some(&ext), cs, 4096, "b").unwrap();
        assert_eq!(d.ranges, vec![1024..1536]);
    }

    #[test]
    fn malformed_tables() {
        let size = 4096 * 512; // one table entry
        let cases: Vec<(Vec<u64>, &str)> = vec![
            (vec![1 << 1], "reserved bits"),
            (vec![1 << 60], "reserved bits"),
            (
                vec![DATA | TABLE_ALL_ONES],
                "both a data offset and the all-ones bit",
            ),
            (vec![DATA + 512 * 8 * 64], "beyond the end of the file"),
        ];
        for (table, want) in cases {
            let (img, size) = Image::one(size, &table, &[]);
            let t = err_text(img.dirty(size, "b"));
            assert!(t.contains(want) && t.contains("'b'"), "{want}: {t}");
        }
        // Two entries, one data cluster.
        let cases: Vec<(Vec<u64>, &str)> = vec![(vec![DATA, DATA], "shared")];
        for (table, want) in cases {
            let (img, size) = Image::one(2 * size, &table, &[&[1]]);
            let t = err_text(img.dirty(size, "b"));
            assert!(t.contains(want) && t.contains("'b'"), "{want}: {t}");
        }
        // A table that does not match the size (a smaller one needs one
        // entry too: fine).
        let (img, _) = Image::one(size, &[0], &[]);
        let t = err_text(img.dirty(size + 512, "b"));
        assert!(t.contains("does not cover the image's size"), "{t}");
        assert_eq!(img.dirty(512, "b").unwrap().ranges, vec![]);
        // A table past the end of the file.
        let e = entry_bytes(b"b", 64 * CS, 1, 0, 9, &[]);
        let t = err_text(Image::new(&[e], &[], &[]).dirty(512, "b"));
        assert!(t.contains("beyond the end of the file"), "{t}");
    }

    #[test]
    fn a_bitmap_of_more_runs_than_the_limit_is_widened_not_dropped() {
        // Alternating bits over more granules than MAX_DIRTY_RANGES * 2: a
        // 1 MiB bitmap that would be 64 MiB of exact ranges. The table
        // from cluster 4, its data clusters right after it.
        let granules = crate::MAX_DIRTY_RANGES as u64 * 2 + 8 * 4096;
        let size = granules * 512;
        let clusters = granules.div_ceil(CS * 8);
        let data = TABLE + (clusters * 8).next_multiple_of(CS);
        let mut file = vec![0x55u8; (data + clusters * CS) as usize];
        file[..data as usize].fill(0);
        let e = entry_bytes(b"b", TABLE, clusters as u32, FLAG_AUTO, 9, &[]);
        file[DIR as usize..DIR as usize + e.len()].copy_from_slice(&e);
        for i in 0..clusters {
            let at = (TABLE + i * 8) as usize;
            file[at..at + 8].copy_from_slice(&(data + i * CS).to_be_bytes());
        }
        let ext = BitmapsExt {
            count: 1,
            directory_size: e.len() as u64,
            directory_offset: DIR,
            consistent: true,
        };
        let got = dirty(&file, Some(&ext), CS, size, "b").unwrap().ranges;
        assert!(
            got.len() <= crate::MAX_DIRTY_RANGES / 2 + 1,
            "{}",
            got.len()
        );
        // Every even granule (bit 0 of 0x55) still inside a range.
        let mut k = 0;
        for g in (0..granules).step_by(2) {
            while got[k].end <= g * 512 {
                k += 1;
            }
            assert!(got[k].start <= g * 512, "granule {g} dropped");
        }
        assert_eq!(got.last().unwrap().end, size);
    }
}
