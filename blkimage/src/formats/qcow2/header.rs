//! The qcow2 header and its extensions, parsed and validated.
//!
//! Everything the reader relies on is checked here, with overflow-checked
//! arithmetic, so the mapping code can trust the geometry: the cluster size,
//! the L1 table's place and size, and the virtual size it covers.

use super::{invalid, unsupported};
use crate::storage::Storage;
use std::io;

/// "QFI\xfb".
pub const MAGIC: [u8; 4] = *b"QFI\xfb";

/// QEMU's limit on the active L1 table: 32 MiB.
pub const MAX_L1_BYTES: u64 = 32 << 20;

pub const MIN_CLUSTER_BITS: u32 = 9;
pub const MAX_CLUSTER_BITS: u32 = 21;

/// Incompatible feature bits.
const INCOMPAT_DIRTY: u64 = 1 << 0;
const INCOMPAT_CORRUPT: u64 = 1 << 1;
const INCOMPAT_DATA_FILE: u64 = 1 << 2;
const INCOMPAT_COMPRESSION: u64 = 1 << 3;
const INCOMPAT_EXTL2: u64 = 1 << 4;
const INCOMPAT_KNOWN: u64 =
    INCOMPAT_DIRTY | INCOMPAT_CORRUPT | INCOMPAT_DATA_FILE | INCOMPAT_COMPRESSION | INCOMPAT_EXTL2;

/// Autoclear bit: the bitmaps extension is consistent.
const AUTOCLEAR_BITMAPS: u64 = 1 << 0;
/// Autoclear bit: the external data file is a consistent raw image.
const AUTOCLEAR_DATA_FILE_RAW: u64 = 1 << 1;

/// QEMU's limits, checked as QEMU checks them on open (so that an image
/// QEMU refuses is refused here too): the refcount table at most 8 MiB,
/// at most 65536 snapshots (headers of at least 40 bytes), bitmaps.
const MAX_REFTABLE_BYTES: u64 = 8 << 20;
const MAX_SNAPSHOTS: u64 = 65536;
const SNAPSHOT_HEADER_LEN: u64 = 40;
pub(super) const MAX_BITMAPS: u32 = 65535;
pub(super) const MAX_BITMAP_DIRECTORY_BYTES: u64 = 64 << 20;
/// QEMU keeps the backing format in 16 bytes with its NUL.
const MAX_BACKING_FORMAT_LEN: usize = 15;

/// Header extension types.
const EXT_END: u32 = 0;
const EXT_BACKING_FORMAT: u32 = 0xe279_2aca;
const EXT_FEATURE_NAMES: u32 = 0x6803_f857;
const EXT_DATA_FILE: u32 = 0x4441_5441;
const EXT_CRYPTO_HEADER: u32 = 0x0537_be77;
const EXT_BITMAPS: u32 = 0x2385_2875;

const V2_HEADER_LEN: u32 = 72;
const V3_HEADER_LEN: u32 = 104;

/// How compressed clusters are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Raw deflate (the default).
    Zlib,
    /// Zstandard (`compression_type=zstd`).
    Zstd,
}

/// What the reader needs from the header, validated.
#[derive(Clone, Debug)]
pub struct Header {
    /// 2 or 3.
    pub version: u32,
    /// log2 of the cluster size.
    pub cluster_bits: u32,
    /// Virtual size in bytes.
    pub size: u64,
    /// Entries in the L1 table.
    pub l1_size: u32,
    /// File offset of the L1 table.
    pub l1_offset: u64,
    /// How compressed clusters are compressed.
    pub compression: Compression,
    /// Extended L2 entries (subclusters).
    pub extended_l2: bool,
    /// Guest data lives in an external data file.
    pub external_data: bool,
    /// The external data file is a raw image of the guest (data_file_raw).
    pub data_file_raw: bool,
    /// The image was not closed cleanly (its refcounts may be stale).
    pub dirty: bool,
    /// Internal snapshots recorded.
    pub nb_snapshots: u32,
    /// The backing file name, as stored (not resolved); `None` without one.
    pub backing_file: Option<Vec<u8>>,
    /// From the backing format extension.
    pub backing_format: Option<String>,
    /// From the external data file name extension.
    pub data_file: Option<Vec<u8>>,
    /// The bitmaps extension (persistent dirty bitmaps), if present.
    pub bitmaps: Option<BitmapsExt>,
}

/// The bitmaps header extension: where the bitmap directory is. Its fields
/// are checked (as QEMU checks them) only when [`BitmapsExt::consistent`];
/// the directory itself is read when bitmaps are asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BitmapsExt {
    /// Bitmaps in the directory (`nb_bitmaps`).
    pub count: u32,
    /// Bytes of the directory (`bitmap_directory_size`).
    pub directory_size: u64,
    /// File offset of the directory (`bitmap_directory_offset`).
    pub directory_offset: u64,
    /// The autoclear bit of the extension is set. When clear, a program
    /// without bitmap support (an old QEMU) opened the image for writing:
    /// every bitmap may miss writes, and QEMU drops them all.
    pub consistent: bool,
}

/// True if `head` (the first bytes of a file) start a qcow2 header of version 2 or later.
pub fn probe(head: &[u8]) -> bool {
    head.len() >= 8 && head[..4] == MAGIC && be32(head, 4) >= 2
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Header {
    /// Bytes per cluster.
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// log2 of the number of entries in an L2 table.
    pub fn l2_bits(&self) -> u32 {
        self.cluster_bits - if self.extended_l2 { 4 } else { 3 }
    }

    /// Read and validate the header of the image in `file`: the fixed
    /// part, the first cluster's fields and extensions, the features, the
    /// tables, the backing file name. The checks run in this order, so
    /// that an image with several faults is refused for the same one.
    pub fn parse(file: &dyn Storage) -> io::Result<Header> {
        let file_len = file.len();
        let fixed = Fixed::read(file, file_len)?;
        let cluster_size = 1u64 << fixed.cluster_bits;

        // The first cluster holds the header, its extensions and the
        // backing file name: read it (or the whole file if shorter).
        let first_len = file_len.min(cluster_size) as usize;
        let header_len = fixed.header_len;
        if (header_len as usize) > first_len {
            return Err(invalid(format!(
                "file too short for its header_length {header_len}"
            )));
        }
        let mut first = vec![0u8; first_len];
        file.read_exact_at(&mut first, 0)?;
        let fields = Fields::of(&first);

        // Extensions come first so that unknown-feature errors can name the feature.
        let ext_end = if fields.backing_offset != 0 {
            fields.backing_offset.min(first_len as u64) as usize
        } else {
            first_len
        };
        let exts = parse_extensions(
            &first,
            header_len as usize,
            ext_end,
            fixed.autoclear,
            cluster_size,
        )?;
        let (external_data, extended_l2) = fixed.features(&exts)?;
        let compression = fixed.compression(&first)?;
        fields.check_tables(fixed.cluster_bits)?;
        fields.check_l1(fixed.cluster_bits, extended_l2, file_len)?;
        let backing_file = backing_file_name(&first, fields.backing_offset, fields.backing_len)?;

        let data_file_raw = external_data && fixed.autoclear & AUTOCLEAR_DATA_FILE_RAW != 0;
        if data_file_raw && backing_file.is_some() {
            return Err(invalid(
                "a raw external data file (data_file_raw) conflicts with a backing file".into(),
            ));
        }

        Ok(Header {
            version: fixed.version,
            cluster_bits: fixed.cluster_bits,
            size: fields.size,
            l1_size: fields.l1_size,
            l1_offset: fields.l1_offset,
            compression,
            extended_l2,
            external_data,
            data_file_raw,
            dirty: fixed.incompatible & INCOMPAT_DIRTY != 0,
            nb_snapshots: fields.nb_snapshots,
            backing_file,
            backing_format: exts.backing_format,
            data_file: external_data.then_some(exts.data_file).flatten(),
            bitmaps: exts.bitmaps,
        })
    }
}

/// The fixed part of the header (its first 72 or 104 bytes), checked: a
/// qcow2 image of a version read here, unencrypted, with a sane geometry.
struct Fixed {
    version: u32,
    cluster_bits: u32,
    header_len: u32,
    incompatible: u64,
    autoclear: u64,
}

impl Fixed {
    /// Read and check the fixed part of the header of `file`, `file_len`
    /// bytes long.
    fn read(file: &dyn Storage, file_len: u64) -> io::Result<Fixed> {
        if file_len < u64::from(V2_HEADER_LEN) {
            return Err(invalid(format!(
                "file too short for a header ({file_len} bytes)"
            )));
        }
        let mut fixed = [0u8; V3_HEADER_LEN as usize];
        let fixed_len = file_len.min(V3_HEADER_LEN.into()) as usize;
        file.read_exact_at(&mut fixed[..fixed_len], 0)?;
        if fixed[..4] != MAGIC {
            return Err(invalid("not a qcow2 image (bad magic)".into()));
        }
        let version = be32(&fixed, 4);
        if !(2..=3).contains(&version) {
            return Err(unsupported(format!("unsupported version {version}")));
        }
        if version == 3 && file_len < u64::from(V3_HEADER_LEN) {
            return Err(invalid(format!(
                "file too short for a version 3 header ({file_len} bytes)"
            )));
        }
        let cluster_bits = be32(&fixed, 20);
        if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&cluster_bits) {
            return Err(invalid(format!(
                "cluster_bits {cluster_bits} out of range ({MIN_CLUSTER_BITS} to {MAX_CLUSTER_BITS})"
            )));
        }
        check_encryption(be32(&fixed, 32))?;

        let (header_len, incompatible, autoclear, refcount_order) = if version == 2 {
            (V2_HEADER_LEN, 0, 0, 4)
        } else {
            (
                be32(&fixed, 100),
                be64(&fixed, 72),
                be64(&fixed, 88),
                be32(&fixed, 96),
            )
        };
        let f = Fixed {
            version,
            cluster_bits,
            header_len,
            incompatible,
            autoclear,
        };
        f.check_lengths(refcount_order)?;
        Ok(f)
    }

    /// The header length (a version 3 header says it) and the refcount
    /// order.
    fn check_lengths(&self, refcount_order: u32) -> io::Result<()> {
        let header_len = self.header_len;
        let cluster_size = 1u64 << self.cluster_bits;
        if self.version == 3 && (header_len < V3_HEADER_LEN || !header_len.is_multiple_of(8)) {
            return Err(invalid(format!(
                "header_length {header_len} is not a multiple of 8 of at least {V3_HEADER_LEN}"
            )));
        }
        if u64::from(header_len) > cluster_size {
            return Err(invalid(format!(
                "header_length {header_len} exceeds the cluster size {cluster_size}"
            )));
        }
        if refcount_order > 6 {
            return Err(invalid(format!(
                "refcount_order {refcount_order} exceeds 6"
            )));
        }
        Ok(())
    }

    /// The incompatible features: none unknown (named from the feature
    /// name table in `exts` if it has them), the image not marked corrupt.
    /// Whether guest data lives in an external data file, and whether L2
    /// entries are extended.
    fn features(&self, exts: &Extensions) -> io::Result<(bool, bool)> {
        let incompatible = self.incompatible;
        if incompatible & INCOMPAT_CORRUPT != 0 {
            return Err(unsupported(
                "the image is marked corrupt (repair it with qemu-img check -r all)".into(),
            ));
        }
        let unknown = incompatible & !INCOMPAT_KNOWN;
        if unknown != 0 {
            let names: Vec<String> = (0..64)
                .filter(|b| unknown & (1 << b) != 0)
                .map(|b| match exts.feature_name(0, b) {
                    Some(n) => format!("bit {b} ({n})"),
                    None => format!("bit {b}"),
                })
                .collect();
            return Err(unsupported(format!(
                "unknown incompatible features: {}",
                names.join(", ")
            )));
        }
        let external_data = incompatible & INCOMPAT_DATA_FILE != 0;
        let extended_l2 = incompatible & INCOMPAT_EXTL2 != 0;
        if extended_l2 && self.cluster_bits < 14 {
            return Err(invalid(format!(
                "extended L2 entries need clusters of at least 16 KiB, not {} bytes",
                1u64 << self.cluster_bits
            )));
        }
        Ok((external_data, extended_l2))
    }

    /// How compressed clusters are compressed: the compression type (in
    /// `first`, the first cluster, past a version 3 header) and its
    /// incompatible bit must agree.
    fn compression(&self, first: &[u8]) -> io::Result<Compression> {
        let compression_type = if self.header_len > V3_HEADER_LEN {
            first[104]
        } else {
            0
        };
        if self.incompatible & INCOMPAT_COMPRESSION != 0 {
            match compression_type {
                0 => Err(invalid(
                    "compression type bit set with the zlib compression type".into(),
                )),
                1 => Ok(Compression::Zstd),
                t => Err(unsupported(format!("unknown compression type {t}"))),
            }
        } else if compression_type != 0 {
            Err(invalid(format!(
                "compression type {compression_type} without the compression type bit"
            )))
        } else {
            Ok(Compression::Zlib)
        }
    }
}

/// The header's encryption method: only none is read here.
fn check_encryption(crypt_method: u32) -> io::Result<()> {
    match crypt_method {
        0 => Ok(()),
        1 => Err(unsupported(
            "encrypted images (AES) are not supported".into(),
        )),
        2 => Err(unsupported(
            "encrypted images (LUKS) are not supported".into(),
        )),
        m => Err(unsupported(format!("unknown encryption method {m}"))),
    }
}

/// The header's fields past its magic and version, as stored (the first
/// cluster holds at least the 72 bytes of a version 2 header).
struct Fields {
    backing_offset: u64,
    backing_len: u32,
    size: u64,
    l1_size: u32,
    l1_offset: u64,
    refcount_table_offset: u64,
    refcount_table_clusters: u32,
    nb_snapshots: u32,
    snapshots_offset: u64,
}

impl Fields {
    fn of(first: &[u8]) -> Fields {
        Fields {
            backing_offset: be64(first, 8),
            backing_len: be32(first, 16),
            size: be64(first, 24),
            l1_size: be32(first, 36),
            l1_offset: be64(first, 40),
            refcount_table_offset: be64(first, 48),
            refcount_table_clusters: be32(first, 56),
            nb_snapshots: be32(first, 60),
            snapshots_offset: be64(first, 64),
        }
    }

    /// The tables' places: the L1 and refcount tables aligned; the
    /// refcount and snapshot tables within QEMU's limits.
    fn check_tables(&self, cluster_bits: u32) -> io::Result<()> {
        let cluster_size = 1u64 << cluster_bits;
        let Fields {
            l1_offset,
            refcount_table_offset,
            refcount_table_clusters,
            nb_snapshots,
            snapshots_offset,
            ..
        } = *self;
        let aligned = |o: u64| o & (cluster_size - 1) == 0;
        if !aligned(l1_offset) {
            return Err(invalid(format!(
                "L1 table offset {l1_offset:#x} is not aligned to the cluster size"
            )));
        }
        if !aligned(refcount_table_offset) {
            return Err(invalid(format!(
                "refcount table offset {refcount_table_offset:#x} is not aligned to the cluster size"
            )));
        }
        // The refcount and snapshot tables are not read (the active layer
        // needs neither), but QEMU refuses images whose tables are too
        // large or whose end overflows, and so do we, with its words.
        if u64::from(refcount_table_clusters) > MAX_REFTABLE_BYTES >> cluster_bits {
            return Err(invalid(format!(
                "Reference count table too large ({refcount_table_clusters} clusters of {cluster_size} bytes; QEMU allows 8 MiB)"
            )));
        }
        let in_i64 = |offset: u64, len: u64| {
            offset
                .checked_add(len)
                .is_some_and(|e| e <= i64::MAX as u64)
        };
        if !in_i64(
            refcount_table_offset,
            u64::from(refcount_table_clusters) << cluster_bits,
        ) {
            return Err(invalid(format!(
                "Reference count table offset invalid ({refcount_table_offset:#x})"
            )));
        }
        if u64::from(nb_snapshots) > MAX_SNAPSHOTS {
            return Err(invalid(format!(
                "Snapshot table too large ({nb_snapshots} snapshots; QEMU allows {MAX_SNAPSHOTS})"
            )));
        }
        // QEMU checks the offset's alignment even without snapshots.
        if !aligned(snapshots_offset)
            || !in_i64(
                snapshots_offset,
                u64::from(nb_snapshots) * SNAPSHOT_HEADER_LEN,
            )
        {
            return Err(invalid(format!(
                "Snapshot table offset invalid ({snapshots_offset:#x}: not aligned to the cluster size, or past the largest offset)"
            )));
        }
        Ok(())
    }

    /// The L1 table: QEMU's limit, inside the file of `file_len` bytes,
    /// and covering the virtual size.
    fn check_l1(&self, cluster_bits: u32, extended_l2: bool, file_len: u64) -> io::Result<()> {
        let Fields {
            l1_size,
            l1_offset,
            size,
            ..
        } = *self;
        let l1_bytes = u64::from(l1_size) * 8;
        if l1_bytes > MAX_L1_BYTES {
            return Err(invalid(format!(
                "L1 table of {l1_size} entries is larger than QEMU allows (32 MiB)"
            )));
        }
        if l1_size > 0 {
            if l1_offset == 0 {
                return Err(invalid("L1 table at offset 0 overlaps the header".into()));
            }
            match l1_offset.checked_add(l1_bytes) {
                Some(end) if end <= file_len => {}
                _ => {
                    return Err(invalid(format!(
                        "L1 table at offset {l1_offset:#x} ({l1_size} entries) is beyond the end of the file"
                    )));
                }
            }
        }
        let l2_bits = cluster_bits - if extended_l2 { 4 } else { 3 };
        let l1_coverage = 1u128 << (cluster_bits + l2_bits);
        if u128::from(size) > u128::from(l1_size) * l1_coverage {
            return Err(invalid(format!(
                "L1 table of {l1_size} entries is too small for the virtual size {size}"
            )));
        }
        Ok(())
    }
}

/// The backing file name, `backing_len` bytes at `backing_offset` (0: no
/// backing file): at most 1023 bytes, inside `first`, the first cluster.
fn backing_file_name(
    first: &[u8],
    backing_offset: u64,
    backing_len: u32,
) -> io::Result<Option<Vec<u8>>> {
    if backing_offset == 0 {
        return Ok(None);
    }
    if backing_len > 1023 {
        return Err(invalid(format!(
            "backing file name too long ({backing_len} bytes)"
        )));
    }
    let end = backing_offset
        .checked_add(backing_len.into())
        .filter(|&e| e <= first.len() as u64)
        .ok_or_else(|| {
            invalid(format!(
                "backing file name at offset {backing_offset:#x} is outside the first cluster or the file"
            ))
        })?;
    let name = &first[backing_offset as usize..end as usize];
    // As QEMU, which keeps it as a C string: a NUL ends the name.
    let name = name.split(|&b| b == 0).next().unwrap_or_default();
    Ok((!name.is_empty()).then(|| name.to_vec()))
}

/// The bitmaps extension (the bitmaps themselves are read on demand, see
/// `bitmaps.rs`): its length always; its fields when the autoclear bit says
/// it is consistent (else QEMU ignores it, with a warning).
fn check_bitmaps(data: &[u8], autoclear: u64, cluster_size: u64) -> io::Result<BitmapsExt> {
    if data.len() != 24 {
        return Err(invalid(format!(
            "bitmaps extension of {} bytes (24 expected)",
            data.len()
        )));
    }
    let count = be32(data, 0);
    let reserved = be32(data, 4);
    let dir_size = be64(data, 8);
    let dir_offset = be64(data, 16);
    let ext = BitmapsExt {
        count,
        directory_size: dir_size,
        directory_offset: dir_offset,
        consistent: autoclear & AUTOCLEAR_BITMAPS != 0,
    };
    if !ext.consistent {
        return Ok(ext);
    }
    let problem = if reserved != 0 {
        "its reserved field is not zero".to_string()
    } else if count == 0 {
        "it has zero bitmaps".to_string()
    } else if count > MAX_BITMAPS {
        format!("{count} bitmaps, more than QEMU allows ({MAX_BITMAPS})")
    } else if dir_offset & (cluster_size - 1) != 0 {
        format!("bitmap directory offset {dir_offset:#x} is not aligned to the cluster size")
    } else if dir_size > MAX_BITMAP_DIRECTORY_BYTES {
        format!(
            "bitmap directory of {dir_size} bytes, more than QEMU allows ({MAX_BITMAP_DIRECTORY_BYTES})"
        )
    } else {
        return Ok(ext);
    };
    Err(invalid(format!("bitmaps extension: {problem}")))
}

#[derive(Default)]
struct Extensions {
    backing_format: Option<String>,
    data_file: Option<Vec<u8>>,
    /// The last bitmaps extension (QEMU keeps the last one too).
    bitmaps: Option<BitmapsExt>,
    /// (type, bit, name) of the feature name table.
    feature_names: Vec<(u8, u8, String)>,
}

impl Extensions {
    fn feature_name(&self, kind: u8, bit: u8) -> Option<&str> {
        self.feature_names
            .iter()
            .find(|(k, b, _)| *k == kind && *b == bit)
            .map(|(_, _, n)| n.as_str())
    }
}

/// The header extensions in `first[start..end]`, checked as QEMU checks
/// them (`autoclear` and `cluster_size` for the bitmaps extension).
fn parse_extensions(
    first: &[u8],
    start: usize,
    end: usize,
    autoclear: u64,
    cluster_size: u64,
) -> io::Result<Extensions> {
    let mut exts = Extensions::default();
    let mut at = start;
    // Each extension takes at least 8 bytes: this ends.
    while at + 8 <= end {
        let kind = be32(first, at);
        let len = be32(first, at + 4) as usize;
        if kind == EXT_END {
            break;
        }
        let data_start = at + 8;
        let data_end = data_start
            .checked_add(len)
            .filter(|&e| e <= end)
            .ok_or_else(|| {
                invalid(format!(
                    "header extension {kind:#x} at offset {at:#x} ({len} bytes) overruns the header area"
                ))
            })?;
        let data = &first[data_start..data_end];
        match kind {
            EXT_BACKING_FORMAT => {
                if exts.backing_format.is_some() {
                    return Err(invalid("two backing format extensions".into()));
                }
                if len > MAX_BACKING_FORMAT_LEN {
                    return Err(invalid(format!(
                        "backing format extension of {len} bytes is too large (QEMU allows {MAX_BACKING_FORMAT_LEN})"
                    )));
                }
                let name = String::from_utf8_lossy(data);
                exts.backing_format = Some(name.trim_end_matches('\0').to_string());
            }
            EXT_DATA_FILE => {
                if exts.data_file.is_some() {
                    return Err(invalid("two external data file name extensions".into()));
                }
                let name = data.split(|&b| b == 0).next().unwrap_or_default();
                exts.data_file = Some(name.to_vec());
            }
            // Encrypted images are refused before extensions are read: a
            // crypto header here belongs to an image that is not encrypted.
            EXT_CRYPTO_HEADER => {
                return Err(invalid(
                    "a full disk encryption (crypto) header extension in an image that is not encrypted with LUKS".into(),
                ));
            }
            EXT_BITMAPS => exts.bitmaps = Some(check_bitmaps(data, autoclear, cluster_size)?),
            EXT_FEATURE_NAMES => {
                for entry in data.chunks_exact(48) {
                    let name = &entry[2..];
                    let name = name.split(|&b| b == 0).next().unwrap_or_default();
                    exts.feature_names.push((
                        entry[0],
                        entry[1],
                        String::from_utf8_lossy(name).into_owned(),
                    ));
                }
            }
            _ => {}
        }
        at = data_start + len.next_multiple_of(8);
    }
    Ok(exts)
}
