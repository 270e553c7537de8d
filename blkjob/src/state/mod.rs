//! The state: DST's block map saved by the last run (`--state MAP`), and a
//! side record (`MAP.dst`) of what DST was when the map was saved, to tell
//! a DST changed behind the state's back.
//!
//! The map is a plain block map (`blkmap DST MAP` makes one too): blkdiff
//! reads it, and its format stays blkmap's. It records SRC's identity
//! ([`crate::record`]: the files SRC read, or its export), which an update
//! through SRC's dirty bitmap checks. The side record is a
//! [`Record`] of DST (one file: device, inode,
//! size, times) bound to the map by a `map` line holding its checksum; the
//! side records of earlier versions (`blksync-dst 1`) are still read.
//!
//! A record bound to another checksum is stale and ignored; a damaged one
//! refuses the state. A block device's times do not change when it is
//! written, so for devices only the device number and size are compared;
//! a few sampled blocks are checked for every state.

pub mod check;
pub mod written;

use crate::record::Record;
use blkhash::{Algorithm, Checksum};
use blkmap::{MapFile, MapLike, Pieces};
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Blocks of DST read and digested to check a state against it.
pub const SAMPLES: u64 = 16;

/// The first line of the side records earlier versions wrote.
const LEGACY_MAGIC: &str = "blksync-dst 1";

/// The side record's path: the state's with `.dst` appended.
pub fn side_path(state: &Path) -> PathBuf {
    let mut p = state.as_os_str().to_owned();
    p.push(".dst");
    PathBuf::from(p)
}

/// The state's lock file: the state's path with `.lock` appended. It is
/// locked (flock) for a whole run and removed at its end
/// ([`crate::guard::lock_file`]: a run that locked a file removed since
/// locks anew, so two runs never hold two files).
pub fn lock_path(state: &Path) -> PathBuf {
    let mut p = state.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// Whether `prefix` (a file's first bytes) starts as a side record (this
/// version's or an earlier one's).
pub fn is_side(prefix: &[u8]) -> bool {
    [crate::record::MAGIC, LEGACY_MAGIC]
        .iter()
        .any(|m| m.as_bytes().starts_with(prefix) || prefix.starts_with(m.as_bytes()))
}

/// The state at `path`, opened where it lies ([`MapFile`]: its digests are
/// read from the file as a run needs them, never loaded whole), once it is
/// known to be intact: a whole map (not a part), read to its end once with
/// every check a load makes (its signature, its checksum). A state that is
/// not is refused before anything is written, as a damaged one was when
/// states were loaded whole; the pass costs a read of the file (1 GiB for
/// 2 TiB of data in 64 KiB blocks), no memory.
///
/// A Proxmox Backup Server fixed index (probed by its magic) is read as
/// the map of the disk it backed up ([`crate::open_index`]: copied to an
/// unnamed temporary file, 32 bytes a chunk, and checked whole there).
/// An encrypted backup's index is read with the key of `open.keyfile`.
pub fn open(path: &Path, open: &blkimage::OpenOptions) -> Result<MapFile, String> {
    if blkmap::is_fidx_file(path) {
        return crate::open_index(path, open).map_err(|e| crate::reason(&e));
    }
    let map = MapFile::open(path).map_err(|e| e.to_string())?;
    map.header().whole().map_err(|e| e.to_string())?;
    let mut pieces = map.pieces().map_err(|e| e.to_string())?;
    while pieces.next_piece().map_err(|e| e.to_string())?.is_some() {}
    drop(pieces);
    Ok(map)
}

/// The checksum of a whole map (a state), from its header; a part has
/// none (and [`open`] refuses it).
pub fn checksum_of(map: &dyn MapLike) -> Option<Checksum> {
    map.header().checksum.clone()
}

/// The side record of `state` that belongs to `map`: `Ok(None)` if there is
/// none, or one left from another map (a run stopped between saving the
/// two: it describes nothing now).
pub fn load_side(state: &Path, map: &dyn MapLike) -> Result<Option<Record>, String> {
    let path = side_path(state);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {}", path.display(), crate::reason(&e))),
    };
    let side = Record::parse_side(&text).map_err(|why| format!("{}: {why}", path.display()))?;
    Ok((side.map == checksum_of(map).map(|c| c.to_hex())).then_some(side))
}

/// How many of DST's blocks a check of the state `map` reads.
pub fn sample_count(map: &dyn MapLike) -> u64 {
    samples(map).len() as u64
}

/// Block indexes to sample: the first block, then spread over the image,
/// shifted by the map's checksum so that states of other images look at
/// other blocks.
fn samples(map: &dyn MapLike) -> Vec<u64> {
    let jitter = checksum_of(map)
        .and_then(|c| c.as_bytes().get(..8)?.try_into().ok())
        .map_or(0, u64::from_le_bytes);
    spread(map.header().blocks(), jitter)
}

/// [`SAMPLES`] block indexes of `n` blocks: the first one, then one per
/// stride, shifted by `jitter` within it.
pub fn spread(n: u64, jitter: u64) -> Vec<u64> {
    if n == 0 {
        return Vec::new();
    }
    let mut v: Vec<u64> = (0..SAMPLES.min(n))
        .map(|k| {
            let stride = n / SAMPLES.min(n);
            if k == 0 {
                0
            } else {
                k * stride + jitter % stride.max(1)
            }
        })
        .map(|i| i.min(n - 1))
        .collect();
    v.dedup();
    v
}

/// Whether `bytes` (a block read now) are the block a map recorded:
/// `None` for a zero block, else its digest, taken with `key` after the
/// block (an encrypted backup's keyed digests; empty: none).
pub fn block_matches(
    (alg, key): (Algorithm, &[u8]),
    bytes: &[u8],
    recorded: Option<&[u8]>,
) -> bool {
    match recorded {
        None => blkhash::is_zero(bytes),
        Some(d) => {
            let mut digest = vec![0u8; alg.output_len()];
            alg.digest_keyed_into(bytes, key, &mut digest);
            digest == d
        }
    }
}

/// Read a few of DST's blocks and check them against `map`: the first one
/// that differs, if any (DST changed behind the state). The map's digests
/// are keyed with `key` (empty: not keyed).
pub fn check_samples(
    read_at: &dyn Fn(&mut [u8], u64) -> io::Result<()>,
    map: &dyn MapLike,
    key: &[u8],
) -> io::Result<Option<u64>> {
    let h = map.header();
    let bs = h.block_size as u64;
    let mut buf = blkhash::try_zeroed(bs as usize, "a sampled block")?;
    for i in samples(map) {
        let offset = i * bs;
        let n = bs.min(h.size - offset) as usize;
        read_at(&mut buf[..n], offset)?;
        let recorded = map.block(i)?;
        if !block_matches((h.algorithm, key), &buf[..n], recorded.as_deref()) {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// Remove the state (the side record first: a map without its record is
/// still checked by samples; a record without its map means nothing), and
/// flush the directory so that the removal is on disk before DST changes.
pub fn remove(state: &Path) -> io::Result<()> {
    let mut removed = false;
    for p in [side_path(state), state.to_path_buf()] {
        match std::fs::remove_file(&p) {
            Ok(()) => removed = true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    if removed {
        sync_dir(state)?;
    }
    Ok(())
}

/// Save the side record of the state whose map (saved) has `checksum`:
/// DST (already flushed) is `dst`, the file at `dst_path`, none for an
/// export. Atomically (temporary file, fsync, rename, directory fsync),
/// as the state itself is written.
pub fn save_side_of(
    state: &Path,
    checksum: &Checksum,
    dst: Option<&File>,
    dst_path: &Path,
    dst_size: u64,
) -> io::Result<()> {
    let side = match dst {
        Some(f) => Some(side_of(checksum, dst_path, &f.metadata()?, dst_size)),
        None => None,
    };
    save_side(state, side)
}

/// The side record of DST, the file at `path` (`meta`, `size` bytes), as
/// the map of checksum `checksum` describes it.
pub fn side_of(checksum: &Checksum, path: &Path, meta: &std::fs::Metadata, size: u64) -> Record {
    Record::of_target(checksum.to_hex(), path, meta, size)
}

/// Save the side record of the state (atomically), or remove it: an NBD
/// export has no identity or times to record (its state is checked by
/// size and sampled blocks only), and a record left by an earlier DST
/// would not be this one's.
pub fn save_side(state: &Path, side: Option<Record>) -> io::Result<()> {
    let path = side_path(state);
    let Some(side) = side else {
        return match std::fs::remove_file(&path) {
            Ok(()) => sync_dir(&path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        };
    };
    blkmap::write_atomic(&path, |w| w.write_all(side.to_text().as_bytes()))
}

/// Before DST is written in a run whose state is the fixed index `index`:
/// a side record at `out` (the state to come) bound to the index's
/// checksum, for DST of `size` bytes. The index is never removed, and
/// would describe DST again to a run started after this one stopped
/// half-way; this record, left without its map, says a run from the index
/// began writing DST (the next run with the index is refused; one with
/// `--state out` reads DST, as with no state, and removes it).
pub fn mark_from_index(out: &Path, index: &Path, size: u64) -> io::Result<()> {
    let csum = blkmap::open_fidx(index)
        .map_err(|e| io::Error::other(format!("{}: {e}", index.display())))?
        .header()
        .index_checksum();
    let record = Record {
        size,
        map: Some(csum.to_hex()),
        remote: Vec::new(),
        files: Vec::new(),
    };
    save_side(out, Some(record))
}

/// Why a fixed index cannot be the state of a run that saves its state to
/// `out`, if it cannot: a state there (or its side record, left by a run
/// from the index that began writing DST) describes DST now.
pub fn index_superseded(out: &Path) -> Option<String> {
    let side = side_path(out);
    let found = [out, side.as_path()].into_iter().find(|p| p.exists())?;
    Some(format!(
        "{} exists: a run from this index wrote DST since it was restored, so the index no \
         longer says what DST holds; run with --state {} instead (DST is read and compared \
         if it holds no map)",
        found.display(),
        out.display()
    ))
}

fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use blkmap::Map;

    #[test]
    fn samples_in_range() {
        let m = Map::compute(
            blkhash::Options::new().block_size(512),
            &vec![1u8; 512 * 1000 + 7],
        )
        .unwrap();
        let s = samples(&m);
        assert_eq!(s.len(), SAMPLES as usize);
        assert!(s.iter().all(|&i| i < m.blocks()));
        let one = Map::compute(blkhash::Options::new().block_size(512), &[1u8; 10]).unwrap();
        assert_eq!(samples(&one), [0]);
    }

    /// The record a run from an index leaves before writing DST refuses
    /// the index to the next run, and describes no map saved there.
    #[test]
    fn a_run_from_an_index_marks_its_state() {
        use blkhash::Algorithm::Sha256;
        let dir = tempfile::tempdir().unwrap();
        let (index, out) = (dir.path().join("x.fidx"), dir.path().join("dst.map"));
        let mut digest = [0u8; 32];
        Sha256.digest_into(&[7u8; 5000], &mut digest);
        let mut csum = [0u8; 32];
        Sha256.digest_into(&digest, &mut csum);
        let mut f = vec![0u8; blkmap::FIDX_HEADER_LEN];
        f[..8].copy_from_slice(&blkmap::FIDX_MAGIC);
        f[32..64].copy_from_slice(&csum);
        f[64..72].copy_from_slice(&5000u64.to_le_bytes());
        f[72..80].copy_from_slice(&(4u64 << 20).to_le_bytes());
        f.extend_from_slice(&digest);
        std::fs::write(&index, &f).unwrap();
        assert_eq!(index_superseded(&out), None);
        mark_from_index(&out, &index, 5000).unwrap();
        let why = index_superseded(&out).unwrap();
        assert!(why.contains("dst.map.dst exists"), "{why}");
        let map = Map::compute(blkhash::Options::new(), &[7u8; 5000]).unwrap();
        assert!(load_side(&out, &map).unwrap().is_none());
        assert_eq!(std::fs::read(&index).unwrap(), f);
    }
}
