//! Parts: the block digests of one byte range of an image, hashed on their
//! own and merged later into the image's map (see [`merge`](crate::merge)).

use crate::format::{Header, MapReader, write_map};
use crate::{Block, Body, MapError, Range, Run};
use blkhash::Algorithm;
use std::io::{self, BufReader, Read, Write};
use std::path::Path;

/// The block digests of the bytes `range` of an image of `size` bytes:
/// what [`MapBuilder::finalize_part`](crate::MapBuilder::finalize_part) gives
/// after hashing those bytes alone.
///
/// A part has no checksum (it follows from every block of the image);
/// parts that cover an image exactly once merge into its map.
///
/// ```
/// use blkhash::{Hasher, Options};
/// use blkmap::{Map, MapBuilder, Part};
/// let opts = Options::new().block_size(4096);
/// let image: Vec<u8> = (0..40000u32).map(|i| (i % 251) as u8).collect();
/// // Hash the two halves apart, as two hosts would.
/// let cut = 5 * 4096;
/// let parts: Vec<Part> = [(0, cut), (cut, image.len())]
///     .into_iter()
///     .map(|(from, to)| {
///         let mut h = Hasher::with_options(opts.clone()).unwrap();
///         let builder = MapBuilder::attach(&mut h).unwrap();
///         h.update(&image[from..to]);
///         builder.finalize_part(h, image.len() as u64, from as u64).unwrap()
///     })
///     .collect();
/// // Merged in any order, they make the map of the whole image.
/// let bytes: Vec<Vec<u8>> = parts.iter().rev().map(Part::to_bytes).collect();
/// let inputs = bytes
///     .iter()
///     .map(|b| ("part".to_string(), Box::new(std::io::Cursor::new(b)) as _))
///     .collect();
/// let mut out = std::io::Cursor::new(Vec::new());
/// let merged = blkmap::merge(inputs, Some(&mut out), None, false).unwrap();
/// let whole = Map::compute(opts, &image).unwrap();
/// assert_eq!(merged.checksum.as_ref(), Some(whole.checksum()));
/// assert_eq!(out.into_inner(), whole.to_bytes());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub(crate) header: Header,
    pub(crate) body: Body,
}

impl Part {
    /// Assemble a part: the body covers exactly the blocks of `range`.
    pub(crate) fn assemble(
        algorithm: Algorithm,
        block_size: usize,
        size: u64,
        range: Range,
        body: Body,
    ) -> Result<Part, MapError> {
        let header = Header {
            algorithm,
            block_size,
            size,
            range,
            checksum: None,
            identity: None,
        };
        header.check()?;
        if body.blocks != header.blocks() {
            return Err(MapError::Invalid(format!(
                "{} blocks for the range {}+{} in {block_size}-byte blocks",
                body.blocks, range.offset, range.len
            )));
        }
        Ok(Part { header, body })
    }

    /// The header the part is written with.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The bytes of the image the part covers.
    pub fn range(&self) -> Range {
        self.header.range
    }

    /// The image's size in bytes.
    pub fn size(&self) -> u64 {
        self.header.size
    }

    /// Blocks the part covers.
    pub fn blocks(&self) -> u64 {
        self.body.blocks
    }

    /// Blocks of data (with a digest each).
    pub fn data_blocks(&self) -> u64 {
        (self.body.digests.len() / self.header.algorithm.output_len()) as u64
    }

    /// Record `identity` (at most [`MAX_IDENTITY`](crate::MAX_IDENTITY)
    /// bytes) of the input in the part: what a checkpoint knows its image
    /// by.
    pub fn set_identity(&mut self, identity: Vec<u8>) -> Result<(), MapError> {
        self.header.identity = Some(identity);
        self.header.check()
    }

    /// The runs of blocks, in order; `first` counts from the part's first
    /// block.
    pub fn runs(&self) -> impl Iterator<Item = Run<'_>> + '_ {
        let len = self.header.algorithm.output_len();
        self.body.runs.iter().map(move |r| Run {
            first: r.first,
            count: r.count,
            digests: r
                .data
                .map(|at| &self.body.digests[at..at + r.count as usize * len]),
        })
    }

    /// The run that holds block `index` (counted from the part's first
    /// block), or `None` past the end.
    pub fn run_at(&self, index: u64) -> Option<Run<'_>> {
        self.body.run_at(index, self.header.algorithm.output_len())
    }

    /// Block `index` (counted from the part's first block), or `None`
    /// past the end.
    pub fn block(&self, index: u64) -> Option<Block<'_>> {
        let run = self.run_at(index)?;
        let len = self.header.algorithm.output_len();
        Some(match run.digests {
            None => Block::Zero,
            Some(d) => Block::Data(&d[(index - run.first) as usize * len..][..len]),
        })
    }

    /// Write the part in the binary format (a map whose header says
    /// `partial` and holds the range instead of the checksum).
    pub fn write_to(&self, w: impl Write) -> io::Result<()> {
        write_map(&self.header, self.runs(), w)
    }

    /// The part in the binary format.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.write_to(&mut v).expect("writing to memory");
        v
    }

    /// Save the part at `path` atomically, refused where a map would be (as
    /// [`Map::save`](crate::Map::save)).
    pub fn save(&self, path: impl AsRef<Path>) -> io::Result<()> {
        self.save_guarded(path, &[])
    }

    /// [`save`](Part::save), refused also when `path` is one of `inputs`
    /// (as [`Map::save_guarded`](crate::Map::save_guarded)).
    pub fn save_guarded(
        &self,
        path: impl AsRef<Path>,
        inputs: &[crate::guard::Input<'_>],
    ) -> io::Result<()> {
        crate::format::save_map(path.as_ref(), inputs, |w| self.write_to(w))
    }

    /// Read a part, or a complete map as the part that covers everything
    /// (its checksum is then not checked: merging does that).
    pub fn read(r: impl Read) -> Result<Part, MapError> {
        let mut reader = MapReader::new(r)?;
        let mut header = reader.header().clone();
        let body = reader.read_body()?;
        header.checksum = None;
        let identity = header.identity.take();
        let mut part = Part::assemble(
            header.algorithm,
            header.block_size,
            header.size,
            header.range,
            body,
        )?;
        part.header.identity = identity;
        Ok(part)
    }

    /// [`read`](Part::read) from bytes in memory.
    pub fn from_bytes(bytes: &[u8]) -> Result<Part, MapError> {
        Part::read(bytes)
    }

    /// Read the part saved at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Part, MapError> {
        let f = crate::format::open_map_file(path.as_ref())?;
        Part::read(BufReader::with_capacity(1 << 20, f))
    }
}
