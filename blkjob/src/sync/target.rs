//! DST as blksync writes it: a raw file or block device, or an NBD export.

use blkimage::nbd::Nbd;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// Where the copy goes.
pub enum Target {
    /// A raw file or a block device, written through the page cache.
    File(File),
    /// An NBD export (any image a server exposes: qemu-nbd serves qcow2
    /// with its own allocation and metadata handling).
    Nbd(Arc<Nbd>),
}

impl Target {
    /// Write all of `buf` at `offset`.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        match self {
            Target::File(f) => f.write_all_at(buf, offset),
            Target::Nbd(n) => n.write_at(buf, offset),
        }
    }

    /// Make `len` bytes at `offset` read as zeros: a hole punched (a file),
    /// a range zeroed by the device (a block device: the kernel does it
    /// without the data crossing), NBD_CMD_WRITE_ZEROES (the server may
    /// punch), else zeros written from `buf`.
    pub fn zero_range(&self, offset: u64, len: u64, buf: &mut [u8]) -> io::Result<()> {
        let f = match self {
            Target::Nbd(n) => return n.write_zeroes(offset, len),
            Target::File(f) => f,
        };
        // SAFETY: fallocate on an open descriptor; no memory is passed.
        let rc = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        buf.fill(0);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            f.write_all_at(&buf[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }

    /// Ask the kernel to start writing back `len` bytes at `offset`,
    /// without waiting: a copy that ends with fsync then overlaps writing
    /// the device with reading and hashing SRC, instead of writing all of
    /// DST at the end (as `qemu-img convert -t writeback` does). Nothing
    /// to do for NBD: the server has the data already.
    pub fn start_writeback(&self, offset: u64, len: usize) -> io::Result<()> {
        let Target::File(f) = self else {
            return Ok(());
        };
        // SAFETY: sync_file_range on an open descriptor; no memory is passed.
        let rc = unsafe {
            libc::sync_file_range(
                f.as_raw_fd(),
                offset as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        match rc {
            0 => Ok(()),
            // Not every file system or device has it; the final fsync does the work.
            _ => match io::Error::last_os_error() {
                e if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ESPIPE)) => Ok(()),
                e => Err(e),
            },
        }
    }

    /// Make everything written durable: fsync, or NBD_CMD_FLUSH.
    pub fn sync(&self) -> io::Result<()> {
        match self {
            Target::File(f) => f.sync_all(),
            Target::Nbd(n) => n.flush(),
        }
    }

    /// Resize a regular file; other targets have a fixed size.
    pub fn set_len(&self, size: u64) -> io::Result<()> {
        match self {
            Target::File(f) => f.set_len(size),
            Target::Nbd(_) => Ok(()),
        }
    }
}
