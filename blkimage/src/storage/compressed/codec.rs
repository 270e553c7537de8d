//! The three decoders behind one step function: gzip (zlib-rs through
//! flate2, which checks each member's header, CRC-32 and length itself),
//! xz (liblzma's multi-threaded stream decoder, which decodes the blocks
//! of a file `xz -T0` wrote on several cores and checks every block's
//! check and the index) and zstd (libzstd, which checks a frame's content
//! size and checksum when the frame has them).

use super::Compression;
use flate2::{Decompress, FlushDecompress, Status};
use liblzma::stream::{Action, MtStreamBuilder, Stream};
use std::io;
use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};

/// The most memory liblzma may use to decode one xz stream on several
/// threads; past it, it decodes on fewer, down to one (as `xz` does past
/// its own limit). Each thread holds a block's input and output and the
/// dictionary: a file of `xz -T0` (blocks of 3 × the dictionary, 24 MiB
/// at the default -6, 192 MiB at -9) fits on 2 threads.
const XZ_MEMLIMIT_THREADING: u64 = 512 << 20;

/// The most memory liblzma may use at all (on one thread: the
/// dictionary): a header asking more (a dictionary of up to 1.5 GiB is
/// valid) is refused rather than allocated. `xz -9` needs 65 MiB.
const XZ_MEMLIMIT_STOP: u64 = 512 << 20;

/// One step's outcome: input consumed, output produced, and whether the
/// member (gzip), stream (xz) or frame (zstd) ended with it.
pub(super) struct Step {
    pub consumed: usize,
    pub produced: usize,
    pub end: bool,
}

/// A decoder of one kind, ready for the next member, stream or frame.
pub(super) enum Codec {
    Gzip(Box<Decompress>),
    Xz(Stream),
    Zstd(Box<Decoder<'static>>),
}

impl Codec {
    /// A decoder of `kind`; xz decodes on `threads` threads.
    pub fn new(kind: Compression, threads: u32) -> io::Result<Codec> {
        Ok(match kind {
            // 15: the largest window, which any gzip file fits.
            Compression::Gzip => Codec::Gzip(Box::new(Decompress::new_gzip(15))),
            Compression::Xz => Codec::Xz(xz_stream(threads)?),
            // libzstd's default window limit (128 MiB), as `zstd -d` has.
            Compression::Zstd => Codec::Zstd(Box::new(Decoder::new()?)),
        })
    }

    /// Ready for the next member or stream (zstd goes on to the next
    /// frame by itself).
    pub fn restart(&mut self, threads: u32) -> io::Result<()> {
        match self {
            Codec::Gzip(d) => **d = Decompress::new_gzip(15),
            Codec::Xz(s) => *s = xz_stream(threads)?,
            Codec::Zstd(_) => {}
        }
        Ok(())
    }

    /// Decode from `input` into `out`; `finish` once the input has ended
    /// (`input` is then empty), for a decoder that holds output back.
    pub fn run(&mut self, input: &[u8], out: &mut [u8], finish: bool) -> io::Result<Step> {
        match self {
            Codec::Gzip(d) => {
                let (i, o) = (d.total_in(), d.total_out());
                let st = d
                    .decompress(input, out, FlushDecompress::None)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                Ok(Step {
                    consumed: (d.total_in() - i) as usize,
                    produced: (d.total_out() - o) as usize,
                    end: st == Status::StreamEnd,
                })
            }
            Codec::Xz(s) => {
                let (i, o) = (s.total_in(), s.total_out());
                let action = if finish { Action::Finish } else { Action::Run };
                let st = s.process(input, out, action).map_err(xz_error)?;
                Ok(Step {
                    consumed: (s.total_in() - i) as usize,
                    produced: (s.total_out() - o) as usize,
                    end: st == liblzma::stream::Status::StreamEnd,
                })
            }
            Codec::Zstd(d) => {
                let mut inb = InBuffer::around(input);
                let mut outb = OutBuffer::around(out);
                let hint = d
                    .run(&mut inb, &mut outb)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                Ok(Step {
                    consumed: inb.pos(),
                    produced: outb.pos(),
                    // 0: the frame is decoded and all of it given out.
                    end: hint == 0,
                })
            }
        }
    }
}

/// liblzma's multi-threaded stream decoder: one stream (the caller goes
/// on to the next after the padding), its check verified, at most
/// [`XZ_MEMLIMIT_STOP`] of memory.
fn xz_stream(threads: u32) -> io::Result<Stream> {
    MtStreamBuilder::new()
        .threads(threads.max(1))
        // 0: block until there is input to take or output to give.
        .timeout_ms(0)
        .memlimit_threading(XZ_MEMLIMIT_THREADING)
        .memlimit_stop(XZ_MEMLIMIT_STOP)
        .decoder()
        .map_err(xz_error)
}

fn xz_error(e: liblzma::stream::Error) -> io::Error {
    use liblzma::stream::Error;
    let kind = match e {
        Error::Mem => io::ErrorKind::OutOfMemory,
        Error::MemLimit => io::ErrorKind::OutOfMemory,
        _ => io::ErrorKind::InvalidData,
    };
    let why = match e {
        Error::MemLimit => format!(
            "the stream needs more than {} MiB of memory to decode",
            XZ_MEMLIMIT_STOP >> 20
        ),
        Error::Data => "corrupt data or a bad check".to_string(),
        Error::Format => "not an xz stream".to_string(),
        e => e.to_string(),
    };
    io::Error::new(kind, why)
}
