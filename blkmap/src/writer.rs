//! Records written as they come, in memory bounded by one buffer whatever
//! the map's size: what a map built while hashing, a merge and an
//! incremental update write through.

use crate::MapError;
use crate::format::{Header, TAG_DATA, TAG_ZEROS};
use blkhash::Algorithm;
use std::io::{self, Read, Seek, SeekFrom, Write};

/// Bytes buffered before a write.
const BUFFER: usize = 1 << 20;

/// Where a map is written as it is built: a new, empty file (or buffer)
/// it can seek in and read back, to patch what is known only at the end
/// (a data run's count, the header's size and checksum) and to sign it.
pub trait Output: Read + Write + Seek {}
impl<T: Read + Write + Seek> Output for T {}

/// Writes a map's records in block order, merging runs of one kind into
/// one record, so that the bytes are those [`Map::write_to`] writes for
/// the same blocks. The header is written first as a template and again
/// at the end ([`RecordWriter::finish`]), when the size and checksum are
/// known; a data record's count is written over a placeholder once the
/// run ends. Memory: one 1 MiB buffer.
///
/// [`Map::write_to`]: crate::Map::write_to
pub struct RecordWriter<W: Output> {
    w: W,
    buf: Vec<u8>,
    /// Bytes already written to `w` (its position).
    flushed: u64,
    header_len: usize,
    /// Zero blocks not written yet.
    zeros: u64,
    /// The open data record: where its count goes, and the count.
    data: Option<(u64, u64)>,
    blocks: u64,
    data_blocks: u64,
    last_zero: bool,
    digest_len: usize,
}

impl<W: Output> RecordWriter<W> {
    /// A writer to `w` (empty, at its start) of records after `header`,
    /// whose size, range and checksum may be placeholders: only its
    /// length must be the final header's.
    pub fn new(w: W, header: &Header) -> io::Result<RecordWriter<W>> {
        let mut buf = Vec::new();
        let cap = BUFFER + (64 << 10);
        (buf.try_reserve_exact(cap)).map_err(|_| blkhash::out_of_memory(cap, "a map's writes"))?;
        header.write_to(&mut buf)?;
        Ok(RecordWriter {
            w,
            header_len: buf.len(),
            buf,
            flushed: 0,
            zeros: 0,
            data: None,
            blocks: 0,
            data_blocks: 0,
            last_zero: false,
            digest_len: header.algorithm.output_len(),
        })
    }

    /// Blocks written so far.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Data blocks written so far.
    pub fn data_blocks(&self) -> u64 {
        self.data_blocks
    }

    /// Whether the last block written is a zero block.
    pub fn last_is_zero(&self) -> bool {
        self.last_zero
    }

    fn pos(&self) -> u64 {
        self.flushed + self.buf.len() as u64
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= BUFFER {
            self.flush_buf()?;
        }
        Ok(())
    }

    fn flush_buf(&mut self) -> io::Result<()> {
        self.w.write_all(&self.buf)?;
        self.flushed += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Write `bytes` at `at`, before the end: in the buffer if it is still
    /// there, else in the output.
    fn patch(&mut self, at: u64, bytes: &[u8]) -> io::Result<()> {
        if at >= self.flushed {
            let i = (at - self.flushed) as usize;
            self.buf[i..i + bytes.len()].copy_from_slice(bytes);
            return Ok(());
        }
        self.flush_buf()?;
        self.w.seek(SeekFrom::Start(at))?;
        self.w.write_all(bytes)?;
        self.w.seek(SeekFrom::Start(self.flushed))?;
        Ok(())
    }

    /// Add `n` zero blocks.
    pub fn zeros(&mut self, n: u64) -> io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.close_data()?;
        self.zeros += n;
        self.blocks += n;
        self.last_zero = true;
        Ok(())
    }

    /// Add data blocks: `digests`, one after another.
    pub fn data(&mut self, digests: &[u8]) -> io::Result<()> {
        let n = (digests.len() / self.digest_len) as u64;
        if n == 0 {
            return Ok(());
        }
        self.close_zeros()?;
        let (at, count) = match self.data {
            Some(open) => open,
            None => {
                self.put(&[TAG_DATA])?;
                let at = self.pos();
                self.put(&0u64.to_le_bytes())?;
                (at, 0)
            }
        };
        self.data = Some((at, count + n));
        self.blocks += n;
        self.data_blocks += n;
        self.last_zero = false;
        self.put(digests)
    }

    fn close_zeros(&mut self) -> io::Result<()> {
        if self.zeros > 0 {
            let n = std::mem::take(&mut self.zeros);
            self.put(&[TAG_ZEROS])?;
            self.put(&n.to_le_bytes())?;
        }
        Ok(())
    }

    fn close_data(&mut self) -> io::Result<()> {
        if let Some((at, count)) = self.data.take() {
            self.patch(at, &count.to_le_bytes())?;
        }
        Ok(())
    }

    /// Close the last record, write `header` (of the template's length)
    /// over the template, and sign what was written: the output, complete.
    ///
    /// The signature (the trailer) is SHA-256 of the header and then the
    /// records, and the header holds the image checksum, known only once
    /// the last block was written: the records cannot be hashed as they
    /// go by, before the header's bytes are known. So they are read back
    /// (from the page cache: they were just written). Hashing them as
    /// they are written would need the checksum before the first record,
    /// that is a pass over the blocks before the one that writes them: as
    /// many reads, in another order, and a base read twice.
    pub fn finish(mut self, header: &Header) -> Result<W, MapError> {
        header.check()?;
        if header.encoded_len() != self.header_len {
            return Err(MapError::Invalid(
                "a header of another length than its template".into(),
            ));
        }
        self.close_data()?;
        self.close_zeros()?;
        let mut bytes = Vec::with_capacity(self.header_len);
        header.write_to(&mut bytes)?;
        self.patch(0, &bytes)?;
        self.flush_buf()?;
        let end = self.flushed;
        let mut w = self.w;
        w.seek(SeekFrom::Start(0))?;
        let mut sign = Algorithm::Sha256.streaming();
        let mut buf = blkhash::try_zeroed(BUFFER, "a map's signature")?;
        let mut left = end;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            w.read_exact(&mut buf[..n])?;
            sign.update(&buf[..n]);
            left -= n as u64;
        }
        w.write_all(&sign.finalize())?;
        w.flush()?;
        Ok(w)
    }
}

/// Write the file `path` atomically with `write`, given the new temporary
/// file (a map written as it is built: [`MapBuilder::writing`],
/// [`splice`](crate::splice)), once the guard let `path` be written in
/// place of what it is and of none of `inputs` ([`crate::guard`]). `path`
/// is the old file or the new one, never a part of one; on an error it is
/// left as it was. An error of the output itself (refused, not created,
/// not renamed) comes as an [`OutputError`], for the caller to name
/// `path` in its message rather than the input.
///
/// [`MapBuilder::writing`]: crate::MapBuilder::writing
pub fn save_with<T>(
    path: &std::path::Path,
    inputs: &[crate::guard::Input<'_>],
    write: impl FnOnce(std::fs::File) -> io::Result<T>,
) -> io::Result<T> {
    let output = |e: io::Error| io::Error::new(e.kind(), OutputError(e));
    crate::guard::check_outputs(&[crate::guard::Output::map(path)], inputs).map_err(output)?;
    let mut value = None;
    let mut failed = None;
    let done = crate::format::write_atomic(path, |w| {
        w.flush()?;
        // A second handle on the new file: what `write` writes goes to it
        // directly, and the buffer `write_atomic` flushes stays empty.
        match write(w.get_ref().try_clone()?) {
            Ok(v) => value = Some(v),
            Err(e) => {
                let kind = e.kind();
                failed = Some(e);
                return Err(io::Error::from(kind));
            }
        }
        Ok(())
    });
    match (failed, done) {
        (Some(e), _) => Err(e),
        (None, Err(e)) => Err(output(e)),
        (None, Ok(())) => Ok(value.expect("written")),
    }
}

/// An error of the file a map is written to, not of what was read to make
/// it ([`save_with`]).
#[derive(Debug)]
pub struct OutputError(pub io::Error);

impl std::fmt::Display for OutputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for OutputError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// A file written in place of another, atomically, by a writer that
/// finishes long after it starts (blksync's state, written while DST is
/// copied and renamed over the old one only once DST is flushed): a
/// temporary file beside the path, named as [`write_atomic`] names its
/// own (so [`remove_stale_temps`] finds those of a killed run), renamed
/// over the path by [`commit`](Pending::commit), removed if dropped
/// before.
///
/// [`write_atomic`]: crate::write_atomic
/// [`remove_stale_temps`]: crate::remove_stale_temps
///
/// ```
/// use std::io::Write;
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("state");
/// let pending = blkmap::Pending::create(&path).unwrap();
/// pending.file().write_all(b"new").unwrap();
/// assert!(!path.exists());
/// pending.commit().unwrap();
/// assert_eq!(std::fs::read(&path).unwrap(), b"new");
/// ```
#[derive(Debug)]
pub struct Pending {
    tmp: std::path::PathBuf,
    path: std::path::PathBuf,
    file: std::fs::File,
    committed: bool,
}

impl Pending {
    /// A new, empty temporary file that will replace `path`.
    pub fn create(path: &std::path::Path) -> io::Result<Pending> {
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
        let (tmp, file) = crate::format::create_temp(crate::format::dir_of(path), name)?;
        // Removed at an exit that skips this one's drop (a signal's).
        crate::temps::record(&tmp, &file);
        Ok(Pending {
            tmp,
            path: path.to_path_buf(),
            file,
            committed: false,
        })
    }

    /// The temporary file, open for reading and writing.
    pub fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// Flush the file to disk, rename it over the path, and flush the
    /// directory: the path is then the new file, on disk.
    pub fn commit(mut self) -> io::Result<()> {
        self.file.sync_all()?;
        std::fs::rename(&self.tmp, &self.path)?;
        self.committed = true;
        crate::temps::forget(&self.tmp);
        std::fs::File::open(crate::format::dir_of(&self.path))?.sync_all()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
            crate::temps::forget(&self.tmp);
        }
    }
}
