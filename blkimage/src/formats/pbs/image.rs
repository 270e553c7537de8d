//! A backup read from its datastore: the fixed index is the format, the
//! chunk store its storage. The digests are read from the index file as
//! they are needed (checked whole when it was opened, and unchanged at
//! the end), a few decoded chunks are kept for the reads that share them:
//! memory stays bounded whatever the disk's size.

use super::fidx::{DIGEST_LEN, FIDX_HEADER_LEN, FidxHeader};
use crate::source::{Extent, ExtentKind, Origin, Role, Source};
use crate::storage::pbs::ChunkStore;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Decoded chunks kept (4 MiB each: 16 MiB): reads of a chunk's parts by
/// several threads decode it once, and the reading threads decode as many
/// chunks at once.
const CACHED: usize = 4;
/// Chunks read at once by the source's own reading threads: 3 took 0.94x
/// the time of 2 and 57 MiB of memory (2: 48 MiB; 4: 0.92x, 70 MiB), on a
/// 1 GiB backup on machine D.
const AHEAD: usize = 3;
/// Digests read from the index at a time for extents: 64 KiB.
const BATCH: u64 = 2048;

/// The disk a backup holds, read from its chunks.
pub struct PbsImage {
    index_path: PathBuf,
    index: File,
    stamp: (u64, std::time::SystemTime),
    header: FidxHeader,
    store: ChunkStore,
    /// The snapshot, as messages name it.
    snapshot: String,
    zero_digest: [u8; 32],
    cache: Mutex<VecDeque<(u64, Arc<Slot>)>>,
}

/// A chunk decoded, or being decoded by the first thread that asked for it
/// (the others wait for it rather than decode it again), or why it could
/// not be.
type Slot = std::sync::OnceLock<Result<Arc<Vec<u8>>, String>>;

impl PbsImage {
    /// The image of the index `index` (checked whole, `header` its
    /// header), its chunks in `store`; `snapshot` names it in messages.
    pub fn new(
        index_path: PathBuf,
        index: File,
        header: FidxHeader,
        store: ChunkStore,
        snapshot: String,
    ) -> io::Result<PbsImage> {
        let meta = index.metadata()?;
        let zero_digest = store.digest_zeros(header.chunk_size);
        Ok(PbsImage {
            index_path,
            index,
            stamp: (meta.len(), meta.modified()?),
            header,
            store,
            snapshot,
            zero_digest,
            cache: Mutex::new(VecDeque::new()),
        })
    }

    /// The index's header.
    pub fn header(&self) -> &FidxHeader {
        &self.header
    }

    /// Whether its chunks are read with a key (an encrypted backup's).
    pub fn keyed(&self) -> bool {
        self.store.key().is_some()
    }

    /// Read and check every chunk that is not zeros (its blob's CRC,
    /// decompressed, decrypted, its length and its digest against the
    /// index), on `threads` threads taking chunks in turn, each holding
    /// one at a time, and keep nothing: the bytes of data and of zeros.
    /// What the disk's checksum in the `pbs` construction needs, whose
    /// block digests are then the index's: one SHA-256 pass, where
    /// reading the disk to digest it again would make two. `progress` is
    /// told of each chunk done; `cancel` stops it ("interrupted").
    pub fn check_chunks(
        &self,
        threads: usize,
        cancel: &AtomicBool,
        progress: &mut dyn FnMut(u64),
    ) -> io::Result<(u64, u64)> {
        let chunks = self.header.size.div_ceil(self.header.chunk_size as u64);
        let next = AtomicU64::new(0);
        let (tx, rx) = std::sync::mpsc::channel::<(u64, io::Result<bool>)>();
        let mut first_error: Option<(u64, io::Error)> = None;
        let (mut data, mut zero) = (0u64, 0u64);
        std::thread::scope(|s| {
            for _ in 0..threads.max(1) {
                let (tx, next) = (tx.clone(), &next);
                s.spawn(move || {
                    while !cancel.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= chunks {
                            return;
                        }
                        let r = self.check_chunk(i);
                        let failed = r.is_err();
                        if tx.send((i, r)).is_err() || failed {
                            next.store(chunks, Ordering::Relaxed);
                            return;
                        }
                    }
                });
            }
            drop(tx);
            for (i, r) in rx {
                let len = self.chunk_len(i) as u64;
                match r {
                    Ok(true) => data += len,
                    Ok(false) => zero += len,
                    // The first chunk of the disk that failed, of those read.
                    Err(e) => match &first_error {
                        Some((j, _)) if *j < i => {}
                        _ => first_error = Some((i, e)),
                    },
                }
                progress(len);
            }
        });
        if let Some((_, e)) = first_error {
            return Err(e);
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "interrupted"));
        }
        self.finish()?;
        Ok((data, zero))
    }

    /// Chunk `i` read and checked ([`PbsImage::check_chunks`]): true, or
    /// false for a full chunk of zeros, not read.
    fn check_chunk(&self, i: u64) -> io::Result<bool> {
        let digest = self.digests(i, 1)?;
        let len = self.chunk_len(i);
        if digest == self.zero_digest && len == self.header.chunk_size {
            return Ok(false);
        }
        self.store
            .read(&digest, len)
            .map_err(|why| self.chunk_error(i, why))?;
        Ok(true)
    }

    fn chunk_error(&self, i: u64, why: impl std::fmt::Display) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: chunk {i} (disk offset {}): {why}",
                self.snapshot,
                i * self.header.chunk_size as u64
            ),
        )
    }

    fn digests(&self, first: u64, n: u64) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; n as usize * DIGEST_LEN];
        let at = FIDX_HEADER_LEN as u64 + first * DIGEST_LEN as u64;
        self.index.read_exact_at(&mut buf, at)?;
        Ok(buf)
    }

    fn chunk_len(&self, i: u64) -> usize {
        let bs = self.header.chunk_size as u64;
        (self.header.size - i * bs).min(bs) as usize
    }

    /// Chunk `i`, decoded and checked (or from the cache, or by the
    /// thread already decoding it).
    fn chunk(&self, i: u64) -> io::Result<Arc<Vec<u8>>> {
        let slot = {
            let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            match c.iter().find(|(j, _)| *j == i) {
                Some((_, s)) => s.clone(),
                None => {
                    if c.len() == CACHED {
                        c.pop_front();
                    }
                    let s = Arc::new(Slot::new());
                    c.push_back((i, s.clone()));
                    s
                }
            }
        };
        let got = slot.get_or_init(|| {
            let digest = self.digests(i, 1).map_err(|e| e.to_string())?;
            let data = self.store.read(&digest, self.chunk_len(i))?;
            Ok(Arc::new(data))
        });
        got.clone().map_err(|why| self.chunk_error(i, why))
    }
}

impl Source for PbsImage {
    fn format(&self) -> &str {
        "pbs"
    }

    fn size(&self) -> u64 {
        self.header.size
    }

    /// Whole chunks: a part of one read alone decodes it, and the reads of
    /// its other parts wait for that (1 MiB reads of 4 MiB chunks took
    /// 1.2x to 2x the time of whole chunks).
    fn read_size(&self, asked: usize) -> usize {
        asked.max(self.header.chunk_size)
    }

    /// Reads on threads of their own, enough for `AHEAD` chunks: each
    /// chunk costs a decompression and a SHA-256 check before its bytes
    /// are digested, work the reading threads do side by side with the
    /// digests (on the digest threads: 1.9x the time).
    fn default_io_depth(&self, read_size: usize) -> usize {
        (AHEAD * self.header.chunk_size)
            .div_ceil(read_size.max(1))
            .max(2)
    }

    /// A full chunk with the digest of a chunk of zeros is zeros, never
    /// read; every other chunk is data.
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let bs = self.header.chunk_size as u64;
        let end = (offset + len).min(self.header.size);
        let mut out: Vec<Extent> = Vec::new();
        let (mut i, last) = (offset / bs, end.div_ceil(bs));
        while i < last {
            let n = (last - i).min(BATCH);
            let digests = self.digests(i, n)?;
            for d in digests.chunks_exact(DIGEST_LEN) {
                let zero = d == self.zero_digest && self.chunk_len(i) == bs as usize;
                let kind = if zero {
                    ExtentKind::Zero
                } else {
                    ExtentKind::Data
                };
                let (from, to) = ((i * bs).max(offset), ((i + 1) * bs).min(end));
                match out.last_mut() {
                    Some(e) if e.kind == kind && e.end() == from => e.len += to - from,
                    _ => out.push(Extent {
                        offset: from,
                        len: to - from,
                        kind,
                    }),
                }
                i += 1;
            }
        }
        Ok(out)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let bs = self.header.chunk_size as u64;
        if offset + buf.len() as u64 > self.header.size {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{}: a read past the disk's end", self.snapshot),
            ));
        }
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            let chunk = self.chunk(at / bs)?;
            let from = (at % bs) as usize;
            let n = (buf.len() - done).min(chunk.len() - from);
            buf[done..done + n].copy_from_slice(&chunk[from..from + n]);
            done += n;
        }
        Ok(())
    }

    /// The index file is the one read when opened.
    fn finish(&self) -> io::Result<()> {
        let meta = self.index.metadata()?;
        if (meta.len(), meta.modified()?) != self.stamp {
            return Err(io::Error::other(format!(
                "{}: written while it was read",
                self.index_path.display()
            )));
        }
        Ok(())
    }

    fn origin(&self) -> Vec<Origin> {
        vec![Origin::File {
            path: self.index_path.clone(),
            role: Role::Image,
        }]
    }
}
