//! A map's blocks read in order from its file, a piece at a time: what an
//! update compares SRC's digests with (DST's state), and what a copy of
//! differing ranges takes SRC's digests from.

use blkmap::{MapError, Piece, Pieces};

/// A map's blocks read in block order from its file (DST's, as its state
/// records them, while SRC's block events come in order; SRC's, while its
/// differing ranges are copied): one piece of the map in memory (at most
/// 1 MiB of digests), never the map.
pub struct Known {
    pieces: Box<dyn Pieces + Send>,
    blocks: u64,
    digest_len: usize,
    /// The digest of a full block of zeros.
    pub zero_digest: Vec<u8>,
    block_size: u64,
    /// The piece at hand: its first block, its blocks, whether they hold
    /// data, and their digests.
    first: u64,
    count: u64,
    data: bool,
    digests: Vec<u8>,
}

impl Known {
    /// The blocks of `pieces`, a map read from its start.
    pub fn new(pieces: Box<dyn Pieces + Send>) -> Known {
        let h = pieces.header();
        let (alg, blocks, block_size) = (h.algorithm, h.blocks(), h.block_size as u64);
        let mut zero_digest = vec![0u8; alg.output_len()];
        alg.digest_into(&vec![0u8; h.block_size], &mut zero_digest);
        Known {
            pieces,
            blocks,
            digest_len: alg.output_len(),
            zero_digest,
            block_size,
            first: 0,
            count: 0,
            data: false,
            digests: Vec::new(),
        }
    }

    /// Bytes per block.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Read on to the piece holding block `index` (never one before the
    /// last asked for): `false` past the state's end.
    pub fn seek(&mut self, index: u64) -> Result<bool, MapError> {
        if index >= self.blocks {
            return Ok(false);
        }
        while self.first + self.count <= index {
            self.first += self.count;
            match self.pieces.next_piece()? {
                None => return Err(MapError::Truncated),
                Some(Piece::Zeros(n)) => (self.count, self.data) = (n, false),
                Some(Piece::Data(d)) => {
                    self.count = (d.len() / self.digest_len) as u64;
                    self.data = true;
                    self.digests.clear();
                    self.digests.extend_from_slice(d);
                }
            }
        }
        Ok(true)
    }

    /// Block `index`'s digest, `None` for a zero block or past the end.
    pub fn block(&mut self, index: u64) -> Result<Option<&[u8]>, MapError> {
        if !self.seek(index)? || !self.data {
            return Ok(None);
        }
        let at = (index - self.first) as usize * self.digest_len;
        Ok(Some(&self.digests[at..at + self.digest_len]))
    }

    /// The end of the piece holding block `index`, and whether its blocks
    /// hold data; `None` past the state's end.
    pub fn run_at(&mut self, index: u64) -> Result<Option<(u64, bool)>, MapError> {
        Ok(self
            .seek(index)?
            .then_some((self.first + self.count, self.data)))
    }
}
