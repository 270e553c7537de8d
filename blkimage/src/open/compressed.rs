//! Opening a compressed image (gzip, xz, zstd) from a file, a URL or a
//! pipe: the image it holds, probed from its first decompressed bytes.
//!
//! A raw image is read as a stream, hashed as it is decoded (its length
//! rounded up to 512 as a raw file's is: the checksum is that of the
//! decompressed file). A format that needs random access (qcow2, read
//! natively; another format QEMU reads, through qemu-nbd), or a raw image
//! when the caller needs random access ([`OpenOptions::random_access`]),
//! is decompressed into an unnamed sparse temporary file in `TMPDIR`
//! ([`spill`]), which the source says ([`Source::decompressed`]).

use super::{Format, Input, OpenOptions};
use crate::formats::qcow2::{self, Qcow2};
use crate::formats::qemu::{self, QemuExport};
use crate::source::{Decompressed, Extent, Origin, Source, pass_through};
use crate::storage::RawFile;
use crate::storage::compressed::{self, Compression, Decoder, Spilled, spill};
use std::io::{self, Read};
use std::sync::Arc;

/// The most bytes an image QEMU reads (vmdk, vhdx, vdi...) may
/// decompress to: 64 TiB, the largest a vhdx can be, the largest of them.
/// (qcow2's bound comes from its header: [`qcow2::max_file_len`].)
const MAX_QEMU_IMAGE: u64 = 64 << 40;

/// The image compressed with `kind` in `input` (from its first byte),
/// its bytes coming from `origin` (what a record of it covers: the
/// compressed file, or nothing for a pipe).
pub(crate) fn open(
    kind: Compression,
    input: Box<dyn Read + Send>,
    origin: Vec<Origin>,
    opts: &OpenOptions,
) -> io::Result<Input> {
    let buffered = io::BufReader::with_capacity(compressed::INPUT_BUFFER, input);
    let mut decoder = Decoder::new(kind, buffered, compressed::default_threads())?;
    let head = compressed::read_head(&mut decoder, 512)?;
    let inner = if qcow2::probe_bytes(&head) {
        Format::Qcow2
    } else if crate::formats::vnbd::probe(&head) {
        Format::Virtnbdbackup
    } else {
        match qemu::probe_bytes(&head, 0, |_, _| None)? {
            Some(f) => Format::Qemu(f),
            None => Format::Raw,
        }
    };
    let limit = match inner {
        Format::Raw if !opts.random_access => {
            let whole = io::Cursor::new(head).chain(decoder);
            return Ok(Input::Stream(Box::new(Padded::new(whole))));
        }
        Format::Raw => u64::MAX,
        Format::Qcow2 => qcow2::max_file_len(&head),
        Format::Qemu(_) => MAX_QEMU_IMAGE,
        Format::Virtnbdbackup => return Err(compressed_stream(kind)),
    };
    let dir = std::env::temp_dir();
    let mut whole = io::Cursor::new(head).chain(decoder);
    let spilled = Arc::new(spill(&mut whole, &dir, limit)?);
    let note = Decompressed {
        compression: kind.name(),
        dir,
        len: spilled.file_len(),
        allocated: spilled.allocated(),
    };
    let inner: Box<dyn Source> = match inner {
        Format::Raw => Box::new(RawFile::open(&spilled.proc_path(), false)?),
        Format::Qcow2 => Box::new(Qcow2::from_storage(spilled.clone()).map_err(
            |e| match e.kind() {
                io::ErrorKind::Unsupported => io::Error::new(
                    e.kind(),
                    format!("{e} (inside a {} file, it is not looked for)", kind.name()),
                ),
                _ => e,
            },
        )?),
        Format::Qemu(f) => Box::new(QemuExport::open(
            &spilled.proc_path(),
            f,
            true,
            opts.secret_file.as_deref(),
            true,
            &opts.nbd,
        )?),
        Format::Virtnbdbackup => return Err(compressed_stream(kind)),
    };
    Ok(Input::Image(Box::new(Unpacked {
        inner,
        origin,
        note,
        _file: spilled,
    })))
}

/// A virtnbdbackup stream inside a compressed file: its chain is found
/// beside it by name, which a decompressed copy has not.
fn compressed_stream(kind: Compression) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "a virtnbdbackup stream compressed with {}: decompress it first",
            kind.name()
        ),
    )
}

/// An image read from the temporary file it was decompressed into: its
/// bytes come from the compressed file (a record covers that), and it
/// says where it was decompressed.
struct Unpacked {
    inner: Box<dyn Source>,
    origin: Vec<Origin>,
    note: Decompressed,
    /// Kept open for `inner` (a raw file, or qemu-nbd, reopens it by its
    /// /proc path).
    _file: Arc<Spilled>,
}

impl Source for Unpacked {
    pass_through!(inner: format, size, read_at, lendable, read_in_place, is_direct,
        default_io_depth, read_size, bytes_in_flight, finish, rounded, bitmaps, dirty);

    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        self.inner.extents(offset, len)
    }

    fn origin(&self) -> Vec<Origin> {
        self.origin.clone()
    }

    fn decompressed(&self) -> Option<Decompressed> {
        Some(self.note.clone())
    }
}

/// A raw image read as a stream, its length rounded up to a multiple of
/// 512 with zeros, as a raw file's is: the checksum of `disk.raw.gz` is
/// that of `disk.raw` (standard input of an uncompressed image is hashed
/// as it comes, as sha256sum would).
struct Padded<R> {
    inner: R,
    len: u64,
    /// Zeros still to give once the input ended.
    tail: Option<u64>,
}

impl<R> Padded<R> {
    fn new(inner: R) -> Padded<R> {
        Padded {
            inner,
            len: 0,
            tail: None,
        }
    }
}

impl<R: Read> Read for Padded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(left) = &mut self.tail {
            let n = (*left).min(buf.len() as u64) as usize;
            buf[..n].fill(0);
            *left -= n as u64;
            return Ok(n);
        }
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.tail = Some(self.len.next_multiple_of(512) - self.len);
            return self.read(buf);
        }
        self.len += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_rounds_up_to_512() {
        for (len, want) in [(0, 0), (1, 512), (512, 512), (1000, 1024), (1025, 1536)] {
            let mut out = Vec::new();
            Padded::new(&vec![1u8; len][..])
                .read_to_end(&mut out)
                .unwrap();
            assert_eq!(out.len(), want, "{len}");
            assert!(out[len..].iter().all(|b| *b == 0));
        }
    }
}
