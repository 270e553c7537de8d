//! A decompressed image written into an unnamed temporary file, for a
//! format that needs random access (a qcow2 image inside a `.gz`): blocks
//! of zeros are left as holes, so the file takes the space of the image's
//! data, not of its size.

use crate::storage::{Storage, check_range};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The unit of holes: a block of this many zero bytes is not written.
const HOLE: usize = 4096;

/// Bytes decoded at once.
const CHUNK: usize = 1 << 20;

/// An unnamed temporary file holding a decompressed image (removed when
/// the last handle to it is closed), as a [`Storage`].
pub struct Spilled {
    file: File,
    len: u64,
    allocated: u64,
    dir: PathBuf,
}

impl Spilled {
    /// The directory it was made in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its length: the decompressed image's.
    pub fn file_len(&self) -> u64 {
        self.len
    }

    /// The disk space it takes (its allocated blocks).
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// A path that opens it while it is open here, for another process
    /// of this user (a private qemu-nbd) or a second handle of this one.
    pub fn proc_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.file.as_raw_fd()
        ))
    }
}

/// Write all of `input` into an unnamed temporary file in `dir` (made
/// with O_TMPFILE where the file system has it, else created and
/// unlinked at once: nothing is left behind however the process ends),
/// blocks of zeros left as holes; an error once more than `limit` bytes
/// come. A full file system is an error naming `dir`.
pub fn spill(input: &mut dyn Read, dir: &Path, limit: u64) -> io::Result<Spilled> {
    let in_dir = |e: io::Error| {
        let hint = match e.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => {
                " (set TMPDIR to a directory with room for the image's data)"
            }
            _ => "",
        };
        let msg = format!(
            "decompressing into a temporary file in {}{hint}: {e}",
            dir.display()
        );
        crate::with_context(e, msg)
    };
    let file = tempfile::tempfile_in(dir).map_err(in_dir)?;
    let mut buf = blkhash::try_zeroed(CHUNK, "a decompression buffer")?;
    let mut pos = 0u64;
    loop {
        let n = read_full(input, &mut buf)?;
        if n == 0 {
            break;
        }
        if pos + n as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "decompresses to more than {limit} bytes, more than the image inside can \
                     hold (a decompression bomb?)"
                ),
            ));
        }
        write_data(&file, &buf[..n], pos).map_err(in_dir)?;
        pos += n as u64;
        if n < buf.len() {
            break;
        }
    }
    file.set_len(pos).map_err(in_dir)?;
    let allocated = file.metadata().map_err(in_dir)?.blocks() * 512;
    Ok(Spilled {
        file,
        len: pos,
        allocated,
        dir: dir.to_path_buf(),
    })
}

/// Write the blocks of `buf` that are not all zeros at `pos` of `file`,
/// each run of them at once.
fn write_data(file: &File, buf: &[u8], pos: u64) -> io::Result<()> {
    let mut run: Option<usize> = None;
    for (i, block) in buf.chunks(HOLE).enumerate() {
        let at = i * HOLE;
        match (blkhash::is_zero(block), run) {
            (false, None) => run = Some(at),
            (true, Some(start)) => {
                file.write_all_at(&buf[start..at], pos + start as u64)?;
                run = None;
            }
            _ => {}
        }
    }
    if let Some(start) = run {
        file.write_all_at(&buf[start..], pos + start as u64)?;
    }
    Ok(())
}

/// Read until `buf` is full or the input ends; the count read.
fn read_full(input: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match input.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

impl Storage for Spilled {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len(), self.len)?;
        FileExt::read_exact_at(&self.file, buf, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_are_holes_and_bytes_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut data = vec![0u8; 3 << 20];
        data[5000] = 1;
        data[(2 << 20) + 10] = 2;
        data.extend_from_slice(b"tail");
        let s = spill(&mut &data[..], dir.path(), u64::MAX).unwrap();
        assert_eq!(s.file_len(), data.len() as u64);
        // Three 4 KiB blocks of data (one of them the tail).
        assert!(
            s.allocated() < 64 << 10,
            "{} bytes allocated",
            s.allocated()
        );
        let mut back = vec![0u8; data.len()];
        s.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, data);
        let again = std::fs::read(s.proc_path()).unwrap();
        assert_eq!(again, data);
        // Nothing in the directory: the file has no name.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn past_the_limit_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let data = vec![7u8; 3 << 20];
        let e = spill(&mut &data[..], dir.path(), 2 << 20).err().unwrap();
        assert!(e.to_string().contains("decompression bomb"), "{e}");
    }

    #[test]
    fn a_missing_directory_is_named() {
        let e = spill(&mut &b"x"[..], Path::new("/nonexistent/dir"), 10)
            .err()
            .unwrap();
        assert!(e.to_string().contains("/nonexistent/dir"), "{e}");
    }
}
