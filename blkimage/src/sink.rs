//! Where the reader's bytes go: the [`Sink`] trait, and the hasher as the
//! sink everything here feeds. The reader ([`read_image`](crate::read_image),
//! [`read_stream`](crate::read_stream)) writes to a sink, and so does the
//! [`ReadAhead`](crate::ReadAhead) in front of one.

use crate::buffer::AlignedBuf;
use std::io;

// A read to do, and bytes lent in place: the hasher's own types, declared
// once there.
pub use blkhash::{Fill, Lend};

/// Where the bytes go, in guest order.
pub trait Sink {
    /// The next `len` bytes, which `fill` produces when the sink runs it.
    fn read(&mut self, len: usize, fill: Fill) -> io::Result<()>;
    /// True if the sink digests lent bytes in place ([`Sink::lend`]): the
    /// reader then lends what a source can lend. False by default: a sink
    /// that would copy lent bytes anyway (into a buffer it writes from, on
    /// a reading thread) is better served by a plain read.
    fn takes_lends(&self) -> bool {
        false
    }
    /// The next `len` bytes, which `lend` lends in place (a memory map of
    /// the file) when the sink runs it. A sink that cannot use them there
    /// copies them, as a read: the default.
    fn lend(&mut self, len: usize, lend: Lend) -> io::Result<()> {
        self.read(
            len,
            Box::new(move |buf: &mut [u8]| {
                let mut copied = false;
                lend(&mut |data: &[u8]| {
                    if data.len() == buf.len() {
                        buf.copy_from_slice(data);
                        copied = true;
                    }
                })?;
                match copied {
                    true => Ok(()),
                    false => Err(io::Error::other(format!("lent bytes were not {len} bytes"))),
                }
            }),
        )
    }
    /// The next bytes, already read, in a buffer the sink owns until it
    /// gives it back from `reclaim`.
    fn data(&mut self, buf: AlignedBuf) -> io::Result<()>;
    /// The next `len` bytes read as zeros.
    fn zeros(&mut self, len: u64) -> io::Result<()>;
    /// Buffers given with [`Sink::data`] the sink needs at once to keep
    /// busy (one per digest worker), if it knows: a
    /// [`ReadAhead`](crate::ReadAhead) in front then allocates that many
    /// besides its reads in flight, not as many again.
    fn busy_with(&self) -> Option<usize> {
        None
    }
    /// A buffer the sink is done with, if any.
    fn reclaim(&mut self) -> Option<AlignedBuf>;
    /// A buffer the sink is done with, waiting for one if it holds any.
    fn reclaim_wait(&mut self) -> Option<AlignedBuf>;
}

/// The hasher is the sink everything here feeds: reads run on its digest
/// workers, read buffers are handed over without a copy, zeros cost nothing.
impl Sink for blkhash::Pipeline<AlignedBuf> {
    fn read(&mut self, len: usize, fill: Fill) -> io::Result<()> {
        self.submit_with(len, fill)
    }
    fn takes_lends(&self) -> bool {
        true
    }
    fn lend(&mut self, len: usize, lend: Lend) -> io::Result<()> {
        self.submit_lent(len, lend)
    }
    fn data(&mut self, buf: AlignedBuf) -> io::Result<()> {
        self.submit(buf);
        Ok(())
    }
    fn zeros(&mut self, len: u64) -> io::Result<()> {
        self.add_zeros(len)
    }
    fn busy_with(&self) -> Option<usize> {
        Some(self.threads())
    }
    fn reclaim(&mut self) -> Option<AlignedBuf> {
        blkhash::Pipeline::reclaim(self)
    }
    fn reclaim_wait(&mut self) -> Option<AlignedBuf> {
        blkhash::Pipeline::reclaim_wait(self)
    }
}
