//! Building a map while hashing, from the hasher's block events.

use crate::format::Header;
use crate::writer::{Output, RecordWriter};
use crate::{Body, Map, MapError, Outer, Part, Range, check_params, zero_digest};
use blkhash::{Algorithm, BlockEvent, Checksum, Hasher, Pipeline};
use std::io;
use std::sync::{Arc, Mutex};

/// What a builder can observe: a [`Hasher`], or a [`Pipeline`] (whose
/// reads can fail, so finishing it is fallible).
pub trait Observed: Sized {
    /// The digest.
    fn algorithm(&self) -> Algorithm;
    /// Bytes per block.
    fn block_size(&self) -> usize;
    /// Bytes given so far.
    fn size(&self) -> u64;
    /// See [`Hasher::set_observer`].
    fn set_observer(&mut self, f: impl FnMut(BlockEvent<'_>) + Send + 'static);
    /// The checksum, or the error of a read that failed.
    fn checksum(self) -> io::Result<Checksum>;
}

impl Observed for Hasher {
    fn algorithm(&self) -> Algorithm {
        Hasher::algorithm(self)
    }
    fn block_size(&self) -> usize {
        Hasher::block_size(self)
    }
    fn size(&self) -> u64 {
        Hasher::len(self)
    }
    fn set_observer(&mut self, f: impl FnMut(BlockEvent<'_>) + Send + 'static) {
        Hasher::set_observer(self, f)
    }
    fn checksum(self) -> io::Result<Checksum> {
        Ok(self.finalize())
    }
}

impl<B: AsRef<[u8]> + Send + 'static> Observed for Pipeline<B> {
    fn algorithm(&self) -> Algorithm {
        Pipeline::algorithm(self)
    }
    fn block_size(&self) -> usize {
        Pipeline::block_size(self)
    }
    fn size(&self) -> u64 {
        Pipeline::len(self)
    }
    fn set_observer(&mut self, f: impl FnMut(BlockEvent<'_>) + Send + 'static) {
        Pipeline::set_observer(self, f)
    }
    fn checksum(self) -> io::Result<Checksum> {
        self.finalize()
    }
}

/// Where a builder puts the blocks: in memory, or written as they come.
enum Sink {
    Memory(Body),
    Written(Box<Written>),
}

/// A map written as it is built ([`MapBuilder::writing`]).
struct Written {
    w: RecordWriter<Box<dyn Output + Send>>,
    template: Header,
    /// The outer digest of a whole map, twice: one checks the hasher's
    /// checksum in its construction, the other gives blkhash 0.11's,
    /// which a map keeps (they differ only at the end: the length).
    outer: Option<[Outer; 2]>,
}

impl Sink {
    fn blocks(&self) -> u64 {
        match self {
            Sink::Memory(b) => b.blocks,
            Sink::Written(w) => w.w.blocks(),
        }
    }

    fn zeros(&mut self, n: u64) -> io::Result<()> {
        match self {
            Sink::Memory(b) => b.push_zeros(n),
            Sink::Written(w) => {
                for o in w.outer.iter_mut().flatten() {
                    o.zeros(n);
                }
                w.w.zeros(n)?;
            }
        }
        Ok(())
    }

    fn data(&mut self, digest: &[u8]) -> io::Result<()> {
        match self {
            Sink::Memory(b) => b.push_data(digest),
            Sink::Written(w) => {
                for o in w.outer.iter_mut().flatten() {
                    o.data(digest);
                }
                w.w.data(digest)?;
            }
        }
        Ok(())
    }
}

struct State {
    body: Sink,
    /// Blocks already taken out as parts ([`MapBuilder::take_part`]).
    taken: u64,
    zero_digest: Vec<u8>,
    /// A keyed builder's digest of a block of zeros ([`MapBuilder::block_key`]):
    /// zero blocks are recorded as data blocks of this digest.
    keyed_zero: Option<Vec<u8>>,
    digest_len: usize,
    /// The first event that did not follow the last one.
    error: Option<String>,
}

impl State {
    fn event(&mut self, e: BlockEvent<'_>) {
        if self.error.is_some() {
            return;
        }
        let (index, count) = match e {
            BlockEvent::Data { index, .. } => (index, 1),
            BlockEvent::Zeros { index, count } => (index, count),
        };
        let expected = self.taken + self.body.blocks();
        if index != expected {
            self.error = Some(format!(
                "block event for block {index} where block {expected} was expected"
            ));
            return;
        }
        let added = match e {
            BlockEvent::Zeros { .. } => match &self.keyed_zero {
                Some(zero) => (0..count).try_for_each(|_| self.body.data(zero)),
                None => self.body.zeros(count),
            },
            BlockEvent::Data { digest, .. } if digest.len() != self.digest_len => {
                self.error = Some(format!(
                    "a block digest of {} bytes, not {}",
                    digest.len(),
                    self.digest_len
                ));
                Ok(())
            }
            // A full block of zeros that was read and digested: a zero
            // block all the same (a short block never has this digest).
            BlockEvent::Data { digest, .. } if digest == self.zero_digest => self.body.zeros(1),
            BlockEvent::Data { digest, .. } => self.body.data(digest),
        };
        if let Err(e) = added {
            self.error = Some(format!("writing the map: {e}"));
        }
    }
}

/// Collects a hasher's block events into a [`Map`].
///
/// The hasher owns its observer, which must be `Send + 'static`: the
/// builder and the observer share the map being built.
///
/// ```
/// use blkhash::{Hasher, Options};
/// use blkmap::MapBuilder;
/// let mut h = Hasher::with_options(Options::new().block_size(512)).unwrap();
/// let builder = MapBuilder::attach(&mut h).unwrap();
/// h.update(&[1u8; 512]);
/// h.update_zeros(1024);
/// h.update(&[2u8; 100]);
/// let map = builder.finalize(h).unwrap();
/// assert_eq!((map.blocks(), map.data_blocks(), map.zero_blocks()), (4, 2, 2));
/// ```
pub struct MapBuilder {
    algorithm: Algorithm,
    block_size: usize,
    state: Arc<Mutex<State>>,
}

impl MapBuilder {
    /// A builder for blocks of `block_size` bytes digested with `algorithm`
    /// (not `null`, which computes no digests).
    pub fn new(algorithm: Algorithm, block_size: usize) -> Result<MapBuilder, MapError> {
        check_params(algorithm, block_size)?;
        Ok(MapBuilder {
            algorithm,
            block_size,
            state: Arc::new(Mutex::new(State {
                body: Sink::Memory(Body::default()),
                taken: 0,
                zero_digest: zero_digest(algorithm, block_size),
                keyed_zero: None,
                digest_len: algorithm.output_len(),
                error: None,
            })),
        })
    }

    /// A builder for `hasher`, set as its observer. Attach it before giving
    /// the hasher any data.
    pub fn attach(hasher: &mut impl Observed) -> Result<MapBuilder, MapError> {
        let b = MapBuilder::new(hasher.algorithm(), hasher.block_size())?;
        hasher.set_observer(b.observer());
        Ok(b)
    }

    /// The builder of a hasher whose block digests are keyed with `key`
    /// ([`blkhash::Options::block_key`]): the map holds the keyed digests,
    /// a zero block's too. A map's zero blocks stand for the digest of
    /// zeros, unkeyed, everywhere a map is read (its checksum checked, a
    /// diff): so a keyed map records each zero block as a data block of
    /// the keyed digest of zeros, as an encrypted backup's index holds its
    /// zero chunks, and it compares with that index, and a map of it, as
    /// it is. 32 bytes a zero block. Set before the first block; an empty
    /// key changes nothing.
    ///
    /// ```
    /// use blkhash::{Algorithm, Hasher, Options};
    /// use blkmap::{Block, MapBuilder};
    /// let opts = Options::new().block_size(512).block_key(b"k");
    /// let mut h = Hasher::with_options(opts).unwrap();
    /// let b = MapBuilder::new(Algorithm::Sha256, 512).unwrap().block_key(b"k");
    /// h.set_observer(b.observer());
    /// h.update(&[0u8; 1024]);
    /// let map = b.finalize(h).unwrap();
    /// assert_eq!(map.zero_blocks(), 0);
    /// let zero = Algorithm::Sha256.digest_zeros_keyed(512, b"k");
    /// assert_eq!(map.block(1), Some(Block::Data(&zero[..])));
    /// ```
    pub fn block_key(self, key: &[u8]) -> MapBuilder {
        if key.is_empty() {
            return self;
        }
        let zero = self.algorithm.digest_zeros_keyed(self.block_size, key);
        {
            let mut st = self.lock();
            // A data block never has an empty digest: none is taken as zeros.
            st.zero_digest = Vec::new();
            st.keyed_zero = Some(zero);
        }
        self
    }

    /// An observer to give [`Hasher::set_observer`] (what
    /// [`attach`](MapBuilder::attach) does).
    pub fn observer(&self) -> impl FnMut(BlockEvent<'_>) + Send + 'static {
        let state = self.state.clone();
        move |e| {
            state
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .event(e)
        }
    }

    /// The map, once the hasher has finished: `size` bytes with this
    /// `checksum`. Checks the events covered every block, in order, and
    /// that the checksum derived from them is `checksum`.
    pub fn finish(self, size: u64, checksum: &Checksum) -> Result<Map, MapError> {
        let (taken, body) = self.take_body()?;
        if taken > 0 {
            return Err(MapError::Invalid(
                "blocks were taken out as parts: not a whole map".into(),
            ));
        }
        Map::assemble(
            self.algorithm,
            self.block_size,
            size,
            checksum.clone(),
            body,
        )
    }

    /// The part of an image of `size` bytes that the hasher's bytes were
    /// (its first byte at `range.offset`), once the hasher has finished.
    /// Checks the events covered the blocks of `range`, in order.
    pub fn finish_part(self, size: u64, range: Range) -> Result<Part, MapError> {
        let (taken, body) = self.take_body()?;
        if taken > 0 {
            return Err(MapError::Invalid(
                "blocks were taken out as parts: not the whole range".into(),
            ));
        }
        Part::assemble(self.algorithm, self.block_size, size, range, body)
    }

    /// The blocks seen since the last call, as the part of an image of
    /// `size` bytes whose bytes the hasher is given from `offset` on: a
    /// checkpoint of a long run, which goes on adding blocks after it.
    /// Only whole blocks are seen before the hasher finishes (a short last
    /// block comes with its end), so the part ends at a block boundary or
    /// at the end of the image.
    pub fn take_part(&self, size: u64, offset: u64) -> Result<Part, MapError> {
        let bs = self.block_size as u64;
        let mut guard = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let st = &mut *guard;
        if let Some(e) = &st.error {
            return Err(MapError::Invalid(e.clone()));
        }
        let Sink::Memory(body) = &mut st.body else {
            return Err(written());
        };
        let start = offset.saturating_add(st.taken * bs).min(size);
        let len = (body.blocks * bs).min(size - start);
        let body = std::mem::take(body);
        st.taken += body.blocks;
        Part::assemble(
            self.algorithm,
            self.block_size,
            size,
            Range { offset: start, len },
            body,
        )
    }

    fn take_body(&self) -> Result<(u64, Body), MapError> {
        let mut guard = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let st = &mut *guard;
        if let Some(e) = st.error.take() {
            return Err(MapError::Invalid(e));
        }
        let Sink::Memory(body) = &mut st.body else {
            return Err(written());
        };
        Ok((st.taken, std::mem::take(body)))
    }

    /// Finish `hasher` (which this builder observes) and return the map,
    /// which holds the checksum. A failed read in the hasher is an error.
    pub fn finalize(self, hasher: impl Observed) -> io::Result<Map> {
        let size = hasher.size();
        let checksum = hasher.checksum()?;
        Ok(self.finish(size, &checksum)?)
    }

    /// Finish `hasher` (which this builder observes), given the bytes of an
    /// image of `size` bytes from `offset` on, and return them as a part.
    pub fn finalize_part(self, hasher: impl Observed, size: u64, offset: u64) -> io::Result<Part> {
        let len = hasher.size();
        hasher.checksum()?;
        Ok(self.finish_part(size, Range { offset, len })?)
    }

    /// A builder for blocks of `block_size` bytes digested with
    /// `algorithm` that writes the map to `out` (new and empty) as the
    /// blocks come, in memory bounded by a buffer whatever the image's
    /// size: a whole map, or with `partial` a part (finish it with
    /// [`finalize_written`](MapBuilder::finalize_written) or
    /// [`finalize_written_part`](MapBuilder::finalize_written_part)). The
    /// bytes are those [`Map::write_to`] or [`Part::write_to`] would
    /// write, with `identity` recorded.
    ///
    /// ```
    /// use blkhash::{Hasher, Options};
    /// use blkmap::{Map, MapBuilder};
    /// let opts = Options::new().block_size(512);
    /// let mut h = Hasher::with_options(opts.clone()).unwrap();
    /// use std::io::Seek;
    /// let mut out = tempfile::tempfile().unwrap();
    /// let builder = MapBuilder::writing(h.algorithm(), 512, Box::new(out.try_clone().unwrap()), false, None).unwrap();
    /// h.set_observer(builder.observer());
    /// h.update(&[1u8; 1000]);
    /// h.update_zeros(4096);
    /// let done = builder.finalize_written(h).unwrap();
    /// out.rewind().unwrap();
    /// let map = Map::read(out).unwrap();
    /// assert_eq!(Some(map.checksum()), done.header.checksum.as_ref());
    /// let mut data = vec![1u8; 1000];
    /// data.resize(5096, 0);
    /// assert_eq!(map, Map::compute(opts, &data).unwrap());
    /// ```
    pub fn writing(
        algorithm: Algorithm,
        block_size: usize,
        out: Box<dyn Output + Send>,
        partial: bool,
        identity: Option<Vec<u8>>,
    ) -> Result<MapBuilder, MapError> {
        let builder = MapBuilder::new(algorithm, block_size)?;
        let template = Header {
            algorithm,
            block_size,
            size: 0,
            range: Range { offset: 0, len: 0 },
            checksum: (!partial).then(|| crate::merge::placeholder(algorithm)),
            identity,
        };
        template.check()?;
        let written = Written {
            w: RecordWriter::new(out, &template)?,
            outer: (!partial).then(|| {
                let zero = zero_digest(algorithm, block_size);
                [Outer::new(algorithm, &zero), Outer::new(algorithm, &zero)]
            }),
            template,
        };
        builder.lock().body = Sink::Written(Box::new(written));
        Ok(builder)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Finish `hasher`, which this builder (made by
    /// [`writing`](MapBuilder::writing)) observes: the map written, its
    /// blocks checked as [`finish`](MapBuilder::finish) checks them.
    pub fn finalize_written(self, hasher: impl Observed) -> io::Result<Summary> {
        let size = hasher.size();
        let checksum = hasher.checksum()?;
        let range = Range {
            offset: 0,
            len: size,
        };
        Ok(self.finish_written(size, range, Some(checksum))?)
    }

    /// [`finalize_written`](MapBuilder::finalize_written) of a part: the
    /// bytes of an image of `size` bytes from `offset` on.
    pub fn finalize_written_part(
        self,
        hasher: impl Observed,
        size: u64,
        offset: u64,
    ) -> io::Result<Summary> {
        let len = hasher.size();
        hasher.checksum()?;
        Ok(self.finish_written(size, Range { offset, len }, None)?)
    }

    fn finish_written(
        self,
        size: u64,
        range: Range,
        checksum: Option<Checksum>,
    ) -> Result<Summary, MapError> {
        let mut st = self.lock();
        if let Some(e) = st.error.take() {
            return Err(MapError::Invalid(e));
        }
        let Sink::Written(written) = std::mem::replace(&mut st.body, Sink::Memory(Body::default()))
        else {
            return Err(MapError::Invalid(
                "a map built in memory, not written".into(),
            ));
        };
        let Written { w, template, outer } = *written;
        // A map keeps blkhash 0.11's checksum, whatever the hasher's
        // construction (the others follow from the same block digests):
        // the hasher's is checked, then replaced.
        let checksum = match (outer, checksum) {
            (Some([check, ours]), Some(claimed)) => {
                if check.checksum_with(claimed.construction(), size) != claimed {
                    return Err(MapError::Checksum);
                }
                Some(ours.checksum(size))
            }
            (_, c) => c,
        };
        let header = Header {
            size,
            range,
            checksum,
            ..template
        };
        header.check()?;
        if w.blocks() != header.blocks() {
            return Err(MapError::Invalid(format!(
                "{} blocks for the range {}+{} in {}-byte blocks",
                w.blocks(),
                range.offset,
                range.len,
                self.block_size
            )));
        }
        if range.end() == size && !size.is_multiple_of(self.block_size as u64) && w.last_is_zero() {
            return Err(MapError::Invalid(
                "the short last block is marked as a zero block".into(),
            ));
        }
        let data_blocks = w.data_blocks();
        w.finish(&header)?;
        Ok(Summary {
            header,
            data_blocks,
        })
    }
}

/// A map or part written as it was built ([`MapBuilder::writing`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Its header, with the checksum of a whole map.
    pub header: Header,
    /// Blocks holding data.
    pub data_blocks: u64,
}

/// A builder writing its map cannot give its blocks in memory.
fn written() -> MapError {
    MapError::Invalid("a map written as it was built, not in memory".into())
}
