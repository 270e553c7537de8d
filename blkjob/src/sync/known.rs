//! A map's blocks read in order from its file: what an update compares
//! SRC's digests with (DST's state), and what a copy of differing ranges
//! takes SRC's digests from.

use blkmap::{Header, Lookup, MapError, Piece, Pieces};
use std::ops::Range;

/// Digests read from a state at a time, when only some blocks are asked
/// for ([`Known::looked_up`]): 1 MiB of SHA-256 digests.
const WINDOW: u64 = 32 << 10;

/// A map's blocks read in block order from its file (DST's, as its state
/// records them, while SRC's block events come in order; SRC's, while its
/// differing ranges are copied): one piece of the map in memory (at most
/// 1 MiB of digests), never the map.
pub struct Known {
    from: From,
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

/// Where a [`Known`]'s blocks come from.
enum From {
    /// Every block, in order, checked as a load checks them.
    Pieces(Box<dyn Pieces + Send>),
    /// Only the blocks of the ranges (ordered), looked up in a map
    /// already checked.
    Lookup(Lookup, Vec<Range<u64>>),
}

impl Known {
    /// The blocks of `pieces`, a map read from its start.
    pub fn new(pieces: Box<dyn Pieces + Send>) -> Known {
        let h = pieces.header().clone();
        Known::with(From::Pieces(pieces), &h)
    }

    /// The blocks in `ranges` (block indexes, ordered, not overlapping) of
    /// the map `header` describes, read from its file by `lookup`: a
    /// state already read whole once and found intact, whose blocks an
    /// update compares with SRC's. Only their digests are read (a window
    /// at a time, never past a range), not the whole state again, and
    /// not checked again; a block outside `ranges` is read alone.
    pub fn looked_up(lookup: Lookup, ranges: Vec<Range<u64>>, header: &Header) -> Known {
        Known::with(From::Lookup(lookup, ranges), header)
    }

    fn with(from: From, h: &Header) -> Known {
        let (alg, blocks, block_size) = (h.algorithm, h.blocks(), h.block_size as u64);
        Known {
            from,
            blocks,
            digest_len: alg.output_len(),
            zero_digest: blkmap::zero_digest(alg, h.block_size),
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
        if index < self.first + self.count {
            return Ok(true);
        }
        match &mut self.from {
            From::Pieces(pieces) => {
                while self.first + self.count <= index {
                    self.first += self.count;
                    match pieces.next_piece()? {
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
            }
            From::Lookup(lookup, ranges) => {
                let (end, data) = lookup.run_at(index)?.ok_or(MapError::Truncated)?;
                let end = match data {
                    // Digests up to the end of the range asked for (or of
                    // the block alone), a window at a time.
                    true => {
                        let k = ranges.partition_point(|r| r.end <= index);
                        let stop = match ranges.get(k) {
                            Some(r) if r.start <= index => r.end,
                            _ => index + 1,
                        };
                        let end = end.min(stop).min(index + WINDOW);
                        lookup.digests(index, end - index, &mut self.digests)?;
                        end
                    }
                    false => end,
                };
                (self.first, self.count, self.data) = (index, end - index, data);
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
    use blkmap::{Block, Map, MapFile, MapReader};

    /// `known`'s blocks `indexes` (ascending) are `map`'s.
    fn check(map: &Map, known: &mut Known, indexes: &[u64]) {
        for &i in indexes {
            let want = match map.block(i).unwrap() {
                Block::Data(d) => Some(d.to_vec()),
                Block::Zero => None,
            };
            let got = known.block(i).unwrap().map(<[u8]>::to_vec);
            assert_eq!(got, want, "block {i}");
            let (end, data) = known.run_at(i).unwrap().unwrap();
            assert!(end > i && data == want.is_some(), "run at {i}");
        }
    }

    /// `map` saved, and looked up for `ranges`.
    fn looked_up(map: &Map, ranges: Vec<Range<u64>>) -> (tempfile::TempDir, Known) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        map.save(&path).unwrap();
        let file = MapFile::open(&path).unwrap();
        let known = Known::looked_up(file.lookup().unwrap(), ranges, file.header());
        (dir, known)
    }

    #[test]
    fn blocks_read_in_order_as_the_map_holds_them() {
        // Data, zeros, data, a short last block; 512-byte blocks.
        let mut data = vec![1u8; 3 * 512];
        data.extend(vec![0u8; 4 * 512]);
        data.extend(vec![2u8; 2 * 512 + 100]);
        let map = Map::compute(blkhash::Options::new().block_size(512), &data).unwrap();
        let reader = MapReader::new(std::io::Cursor::new(map.to_bytes())).unwrap();
        let ranges = vec![0..1, 2..4, 5..6, 7..10];
        let (_dir, lookup) = looked_up(&map, ranges);
        for mut known in [Known::new(Box::new(reader)), lookup] {
            check(&map, &mut known, &[0, 0, 2, 3, 5, 7, 9]);
            assert_eq!(known.block(10).unwrap(), None, "past the end");
            assert_eq!(known.run_at(10).unwrap(), None);
            let back = known.block(3).unwrap_err().to_string();
            assert!(back.contains("read in order"), "{back}");
        }
    }

    #[test]
    fn blocks_looked_up_in_a_map_of_many_runs() {
        // 3000 runs of 1 to 3 blocks, data and zeros in turn: the map's
        // index (one record in 256) is used to skip ahead.
        let mut data = Vec::new();
        for k in 0..3000usize {
            let fill = if k % 2 == 0 { (k % 251 + 1) as u8 } else { 0 };
            data.extend(vec![fill; 512 * (k % 3 + 1)]);
        }
        let map = Map::compute(blkhash::Options::new().block_size(512), &data).unwrap();
        let blocks = map.blocks();
        let ranges = vec![3..40, 700..701, 2000..2600, 5000..blocks];
        let mut asked: Vec<u64> = ranges.iter().flat_map(|r| r.clone().step_by(7)).collect();
        asked.extend([41, 1999, 4000]);
        asked.sort();
        let (_dir, mut known) = looked_up(&map, ranges);
        check(&map, &mut known, &asked);
    }
}
