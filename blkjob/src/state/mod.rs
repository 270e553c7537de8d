//! The state: DST's block map saved by the last run (`--state MAP`), and a
//! side record (`MAP.dst`) of what DST was when the map was saved, to tell
//! a DST changed behind the state's back.
//!
//! The map is a plain block map (`blkmap DST MAP` makes one too): blkdiff
//! reads it, and its format stays blkmap's. The side record is a few lines
//! of text bound to the map by its checksum:
//!
//! ```text
//! blksync-dst 1
//! checksum <the map's checksum, hex>
//! kind file|block
//! dev <st_dev>
//! ino <st_ino>
//! rdev <st_rdev>
//! size <bytes>
//! mtime <seconds>.<nanoseconds>
//! ctime <seconds>.<nanoseconds>
//! sha256 <SHA-256 of the lines above, hex>
//! ```
//!
//! A record bound to another checksum is stale and ignored; a damaged one
//! refuses the state. A block device's times do not change when it is
//! written, so for devices only the device number and size are compared;
//! a few sampled blocks are checked for every state.

pub mod check;

use blkhash::{Algorithm, to_hex};
use blkmap::{Block, Map};
use std::fs::{File, Metadata};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Blocks of DST read and digested to check a state against it.
pub const SAMPLES: u64 = 16;

const MAGIC: &str = "blksync-dst 1";

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

/// Whether `prefix` (a file's first bytes) starts as a side record.
pub fn is_side(prefix: &[u8]) -> bool {
    MAGIC.as_bytes().starts_with(prefix) || prefix.starts_with(MAGIC.as_bytes())
}

/// What identifies DST's content as the state saw it.
#[derive(Debug, PartialEq, Eq)]
pub struct Side {
    /// The checksum of the state's map (hex), which this record belongs to.
    pub checksum: String,
    /// "file", "block" or "nbd".
    pub kind: String,
    /// The device DST's file is on.
    pub dev: u64,
    /// DST's inode number.
    pub ino: u64,
    /// The device number, for a block device.
    pub rdev: u64,
    /// DST's size in bytes.
    pub size: u64,
    /// Last modification (seconds, nanoseconds).
    pub mtime: (i64, i64),
    /// Last status change (seconds, nanoseconds): changes on any write,
    /// even one that restores mtime.
    pub ctime: (i64, i64),
}

impl Side {
    /// The record of DST (`meta`, `size` bytes) as `map` describes it.
    pub fn of(map: &Map, meta: &Metadata, size: u64) -> Side {
        Side::of_file(map.checksum().to_hex(), meta, size)
    }

    /// The record of a file or device (`meta`, `size` bytes), bound to
    /// `checksum`.
    pub fn of_file(checksum: String, meta: &Metadata, size: u64) -> Side {
        let block = meta.file_type().is_block_device();
        Side {
            checksum,
            kind: if block { "block" } else { "file" }.to_string(),
            dev: meta.dev(),
            ino: meta.ino(),
            rdev: meta.rdev(),
            size,
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// The record of an export (kind `nbd`): only its size; samples check
    /// the rest.
    pub fn of_export(checksum: String, size: u64) -> Side {
        Side {
            checksum,
            kind: "nbd".to_string(),
            dev: 0,
            ino: 0,
            rdev: 0,
            size,
            mtime: (0, 0),
            ctime: (0, 0),
        }
    }

    fn body(&self) -> String {
        format!(
            "{MAGIC}\nchecksum {}\nkind {}\ndev {}\nino {}\nrdev {}\nsize {}\nmtime {}.{:09}\nctime {}.{:09}\n",
            self.checksum,
            self.kind,
            self.dev,
            self.ino,
            self.rdev,
            self.size,
            self.mtime.0,
            self.mtime.1,
            self.ctime.0,
            self.ctime.1
        )
    }

    /// The record as saved: its fields and their sha256.
    pub fn to_text(&self) -> String {
        let body = self.body();
        format!("{body}sha256 {}\n", sha256_hex(body.as_bytes()))
    }

    /// Parse a record; `Err` says why it is not one.
    pub fn parse(text: &str) -> Result<Side, String> {
        let (body, sum) = text
            .trim_end_matches('\n')
            .rsplit_once('\n')
            .ok_or("truncated")?;
        let body = format!("{body}\n");
        match sum.strip_prefix("sha256 ") {
            Some(hex) if hex == sha256_hex(body.as_bytes()) => {}
            _ => return Err("damaged: its digest does not match its contents".into()),
        }
        let mut lines = body.lines();
        if lines.next() != Some(MAGIC) {
            return Err(format!("not a '{MAGIC}' record"));
        }
        let mut field = |name: &str| -> Result<String, String> {
            lines
                .next()
                .and_then(|l| l.strip_prefix(name))
                .and_then(|l| l.strip_prefix(' '))
                .map(str::to_string)
                .ok_or_else(|| format!("no '{name}' line"))
        };
        let num = |v: String| v.parse::<u64>().map_err(|_| format!("bad number '{v}'"));
        let time = |v: String| -> Result<(i64, i64), String> {
            let (s, ns) = v.split_once('.').ok_or(format!("bad time '{v}'"))?;
            Ok((
                s.parse().map_err(|_| format!("bad time '{v}'"))?,
                ns.parse().map_err(|_| format!("bad time '{v}'"))?,
            ))
        };
        Ok(Side {
            checksum: field("checksum")?,
            kind: field("kind")?,
            dev: num(field("dev")?)?,
            ino: num(field("ino")?)?,
            rdev: num(field("rdev")?)?,
            size: num(field("size")?)?,
            mtime: time(field("mtime")?)?,
            ctime: time(field("ctime")?)?,
        })
    }

    /// How `now` (DST as it is) differs from this record, if it does.
    pub fn changed(&self, now: &Side) -> Option<String> {
        self.changed_since(now, "the state")
    }

    /// How `now` differs from this record that `saved` ("the state", "the
    /// checkpoint") keeps, if it does.
    pub fn changed_since(&self, now: &Side, saved: &str) -> Option<String> {
        if self.kind != now.kind {
            return Some(format!("it was a {} and is now a {}", self.kind, now.kind));
        }
        let same_node = if self.kind == "block" {
            self.rdev == now.rdev
        } else {
            (self.dev, self.ino) == (now.dev, now.ino)
        };
        if !same_node {
            return Some(format!(
                "it is another file or device than the one {saved} was saved for"
            ));
        }
        if self.size != now.size {
            return Some(format!(
                "its size changed from {} to {}",
                self.size, now.size
            ));
        }
        // A device's times do not follow writes to it: samples check those.
        if self.kind == "file" && (self.mtime, self.ctime) != (now.mtime, now.ctime) {
            let (what, now, then) = if self.mtime != now.mtime {
                ("modification", now.mtime, self.mtime)
            } else {
                ("change", now.ctime, self.ctime)
            };
            return Some(format!(
                "it changed after {saved} was saved (its times: its {what} time is {}, {saved} recorded {})",
                when(now),
                when(then)
            ));
        }
        None
    }
}

/// A file time as people read it: `2026-11-23T22:15:07.123456789Z` (UTC).
fn when((secs, nanos): (i64, i64)) -> String {
    let t = match u64::try_from(secs) {
        Ok(s) => {
            std::time::UNIX_EPOCH + std::time::Duration::new(s, nanos.clamp(0, 999_999_999) as u32)
        }
        Err(_) => return format!("{secs}.{nanos:09} s since 1970"),
    };
    humantime::format_rfc3339_nanos(t).to_string()
}

fn sha256_hex(data: &[u8]) -> String {
    let mut d = [0u8; 32];
    Algorithm::Sha256.digest_into(data, &mut d);
    to_hex(&d)
}

/// The side record of `state` that belongs to `map`: `Ok(None)` if there is
/// none, or one left from another map (a run stopped between saving the
/// two: it describes nothing now).
pub fn load_side(state: &Path, map: &Map) -> Result<Option<Side>, String> {
    let path = side_path(state);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {}", path.display(), crate::reason(&e))),
    };
    let text = String::from_utf8(text).map_err(|_| format!("{}: damaged", path.display()))?;
    let side = Side::parse(&text).map_err(|why| format!("{}: {why}", path.display()))?;
    Ok((side.checksum == map.checksum().to_hex()).then_some(side))
}

/// Block indexes to sample: the first block, then spread over the image,
/// shifted by the map's checksum so that states of other images look at
/// other blocks.
fn samples(map: &Map) -> Vec<u64> {
    let c = map.checksum().as_bytes();
    spread(
        map.blocks(),
        u64::from_le_bytes(c[..8].try_into().unwrap_or([0; 8])),
    )
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
/// `None` for a zero block, else its digest.
pub fn block_matches(alg: Algorithm, bytes: &[u8], recorded: Option<&[u8]>) -> bool {
    match recorded {
        None => blkhash::is_zero(bytes),
        Some(d) => {
            let mut digest = vec![0u8; alg.output_len()];
            alg.digest_into(bytes, &mut digest);
            digest == d
        }
    }
}

/// Read a few of DST's blocks and check them against `map`: the first one
/// that differs, if any (DST changed behind the state).
pub fn check_samples(
    read_at: &dyn Fn(&mut [u8], u64) -> io::Result<()>,
    map: &Map,
) -> io::Result<Option<u64>> {
    let bs = map.block_size() as u64;
    let mut buf = vec![0u8; bs as usize];
    for i in samples(map) {
        let offset = i * bs;
        let n = bs.min(map.size() - offset) as usize;
        read_at(&mut buf[..n], offset)?;
        let ok = match map.block(i) {
            Some(Block::Zero) => block_matches(map.algorithm(), &buf[..n], None),
            Some(Block::Data(d)) => block_matches(map.algorithm(), &buf[..n], Some(d)),
            None => false,
        };
        if !ok {
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

/// Save `map` as the state of DST (already flushed), then its side record,
/// each atomically (temporary file, fsync, rename, directory fsync).
pub fn save(state: &Path, map: &Map, dst: Option<&File>, dst_size: u64) -> io::Result<()> {
    map.save(state)?;
    let side = match dst {
        Some(f) => Some(Side::of(map, &f.metadata()?, dst_size)),
        None => None,
    };
    save_side(state, side)
}

/// Save the side record of the state (atomically), or remove it: an NBD
/// export has no identity or times to record (its state is checked by
/// size and sampled blocks only), and a record left by an earlier DST
/// would not be this one's.
pub fn save_side(state: &Path, side: Option<Side>) -> io::Result<()> {
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

    #[test]
    fn side_round_trip_and_damage() {
        let s = Side {
            checksum: "ab".into(),
            kind: "file".into(),
            dev: 1,
            ino: 2,
            rdev: 0,
            size: 4096,
            mtime: (5, 6),
            ctime: (7, 8),
        };
        let t = s.to_text();
        assert_eq!(Side::parse(&t), Ok(s));
        let bad = t.replace("size 4096", "size 4097");
        assert!(Side::parse(&bad).unwrap_err().contains("damaged"));
        assert!(Side::parse(&t[..t.len() / 2]).is_err());
    }

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
}
