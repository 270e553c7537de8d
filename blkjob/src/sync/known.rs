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
        let zero_digest = blkmap::zero_digest(alg, h.block_size);
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

    /// Read on to the piece holding block `index`: `false` past the map's
    /// end. The pieces before it are gone: a block before the piece at hand
    /// is an error, not a read from the start again.
    fn seek(&mut self, index: u64) -> Result<bool, MapError> {
        if index >= self.blocks {
            return Ok(false);
        }
        if index < self.first {
            return Err(MapError::Invalid(format!(
                "block {index} asked for after block {}: the map is read in order",
                self.first
            )));
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
    /// hold data; `None` past the map's end.
    pub fn run_at(&mut self, index: u64) -> Result<Option<(u64, bool)>, MapError> {
        Ok(self
            .seek(index)?
            .then_some((self.first + self.count, self.data)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blkmap::{Block, Map, MapReader};

    #[test]
    fn blocks_read_in_order_as_the_map_holds_them() {
        // Data, zeros, data, a short last block; 512-byte blocks.
        let mut data = vec![1u8; 3 * 512];
        data.extend(vec![0u8; 4 * 512]);
        data.extend(vec![2u8; 2 * 512 + 100]);
        let map = Map::compute(blkhash::Options::new().block_size(512), &data).unwrap();
        let reader = MapReader::new(std::io::Cursor::new(map.to_bytes())).unwrap();
        let mut known = Known::new(Box::new(reader));
        for i in [0, 0, 2, 3, 5, 7, 9] {
            let want = match map.block(i).unwrap() {
                Block::Data(d) => Some(d.to_vec()),
                Block::Zero => None,
            };
            assert_eq!(
                known.block(i).unwrap().map(<[u8]>::to_vec),
                want,
                "block {i}"
            );
        }
        assert_eq!(known.block(10).unwrap(), None, "past the end");
        assert_eq!(known.run_at(10).unwrap(), None);
        let back = known.block(3).unwrap_err().to_string();
        assert!(back.contains("read in order"), "{back}");
    }
}
