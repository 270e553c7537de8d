//! Which bytes of an image a job hashes, as the user names them.

/// Which bytes of an image to hash: `OFFSET+LENGTH` (sizes with
/// suffixes; `OFFSET+` reaches the end of the image), as blkdiff prints
/// ranges, or `K/N`, the K-th of N parts of about equal size cut at block
/// boundaries (K from 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    /// Bytes from `offset`: `len` of them, or to the end.
    Range {
        /// The first byte.
        offset: u64,
        /// Bytes; `None` reaches the end of the image.
        len: Option<u64>,
    },
    /// Part `index` (1 to `count`) of `count`.
    Part {
        /// From 1 to `count`.
        index: u64,
        /// Parts the image is cut into.
        count: u64,
    },
}

impl Span {
    /// The byte range `(offset, len)` of an image of `size` bytes in blocks
    /// of `block_size`. Only that the range lies within the image is checked
    /// here; block alignment is the map's to check (and say).
    pub fn resolve(&self, size: u64, block_size: usize) -> Result<(u64, u64), String> {
        match *self {
            Span::Range { offset, len } => {
                let len = match len {
                    Some(l) => l,
                    None => size.checked_sub(offset).ok_or_else(|| {
                        format!(
                            "the range starts at {offset}, past the end of the image ({size} bytes)"
                        )
                    })?,
                };
                if offset.checked_add(len).is_none_or(|end| end > size) {
                    return Err(format!(
                        "the range {offset}+{len} ends past the end of the image ({size} bytes)"
                    ));
                }
                Ok((offset, len))
            }
            Span::Part { index, count } => {
                let bs = block_size as u64;
                let blocks = size.div_ceil(bs) as u128;
                let cut = |k: u64| {
                    let block = (blocks * k as u128 / count as u128) as u64;
                    block.saturating_mul(bs).min(size)
                };
                let (from, to) = (cut(index - 1), cut(index));
                Ok((from, to - from))
            }
        }
    }
}
