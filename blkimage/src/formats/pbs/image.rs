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
use std::sync::{Arc, Mutex};

/// Decoded chunks kept: reads of a chunk's parts by several threads
/// decode it once (4 MiB each: 24 MiB).
const CACHED: usize = 6;
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
    cache: Mutex<VecDeque<(u64, Arc<Vec<u8>>)>>,
}

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
        let zero_digest = store.digest(&vec![0u8; header.chunk_size]);
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

    /// Chunk `i`, decoded and checked (or from the cache).
    fn chunk(&self, i: u64) -> io::Result<Arc<Vec<u8>>> {
        let cached = |c: &VecDeque<(u64, Arc<Vec<u8>>)>| {
            c.iter().find(|(j, _)| *j == i).map(|(_, d)| d.clone())
        };
        if let Some(d) = cached(&self.cache.lock().unwrap_or_else(|p| p.into_inner())) {
            return Ok(d);
        }
        let digest = self.digests(i, 1)?;
        let data = self.store.read(&digest, self.chunk_len(i)).map_err(|why| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: chunk {i} (disk offset {}): {why}",
                    self.snapshot,
                    i * self.header.chunk_size as u64
                ),
            )
        })?;
        let data = Arc::new(data);
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if c.len() == CACHED {
            c.pop_front();
        }
        c.push_back((i, data.clone()));
        Ok(data)
    }
}

impl Source for PbsImage {
    fn format(&self) -> &str {
        "pbs"
    }

    fn size(&self) -> u64 {
        self.header.size
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
