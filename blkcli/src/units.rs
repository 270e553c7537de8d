//! What the commands share when they read sizes and report errors: one
//! implementation, so that blksum, blkmap, blkdiff and blksync take the same
//! spellings and say the same things.

use blkhash::{MAX_BLOCK_SIZE, MIN_BLOCK_SIZE};
use std::io;

/// A size with an optional suffix k, m or g (powers of 1024; "KiB", "M"...
/// accepted).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let num: u64 = num.parse().map_err(|_| format!("invalid size '{s}'"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        _ => return Err(format!("invalid size suffix in '{s}' (use k, m or g)")),
    };
    num.checked_mul(1 << shift)
        .ok_or_else(|| format!("size '{s}' too large"))
}

/// A block size: a multiple of 512 from 512 to 64m.
pub fn parse_block_size(s: &str) -> Result<usize, String> {
    let n = parse_size(s)?;
    if n % 512 != 0 || !(MIN_BLOCK_SIZE as u64..=MAX_BLOCK_SIZE as u64).contains(&n) {
        return Err(format!(
            "block size must be a multiple of 512 from 512 to 64m, not {n}"
        ));
    }
    Ok(n as usize)
}

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

/// Parse a [`Span`]: `OFFSET+LENGTH`, `OFFSET+`, or `K/N`.
///
/// ```
/// use blkcli::units::{Span, parse_span};
/// assert_eq!(parse_span("1g+64k"), Ok(Span::Range { offset: 1 << 30, len: Some(65536) }));
/// assert_eq!(parse_span("4096+"), Ok(Span::Range { offset: 4096, len: None }));
/// assert_eq!(parse_span("2/8"), Ok(Span::Part { index: 2, count: 8 }));
/// assert!(parse_span("0/8").is_err() && parse_span("9/8").is_err() && parse_span("1g").is_err());
/// // The 3rd of 4 parts of a 10-block image of 64 KiB blocks: blocks 5 to 7.
/// assert_eq!(Span::Part { index: 3, count: 4 }.resolve(10 << 16, 1 << 16), Ok((5 << 16, 2 << 16)));
/// ```
pub fn parse_span(s: &str) -> Result<Span, String> {
    if let Some((k, n)) = s.split_once('/') {
        let num = |v: &str| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| format!("invalid part '{s}': use K/N, as 1/8"))
        };
        let (index, count) = (num(k)?, num(n)?);
        if count == 0 || index == 0 || index > count {
            return Err(format!("invalid part '{s}': K/N with K from 1 to N"));
        }
        return Ok(Span::Part { index, count });
    }
    let (offset, len) = s.split_once('+').ok_or_else(|| {
        format!("invalid range '{s}': use OFFSET+LENGTH (as blkdiff prints), OFFSET+ or K/N")
    })?;
    let offset = parse_size(offset)?;
    let len = if len.trim().is_empty() {
        None
    } else {
        Some(parse_size(len)?)
    };
    Ok(Span::Range { offset, len })
}

/// A timeout in seconds (fractions allowed), more than 0 and at most 10^6.
pub fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    parse_seconds(s, "a timeout")
}

/// A time between checkpoint saves in seconds (fractions allowed), more
/// than 0 and at most 10^6.
pub fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    parse_seconds(s, "the time between saves")
}

fn parse_seconds(s: &str, what: &str) -> Result<std::time::Duration, String> {
    match s.parse::<f64>() {
        Ok(t) if t > 0.0 && t <= 1e6 => Ok(std::time::Duration::from_secs_f64(t)),
        _ => Err(format!(
            "{what} is seconds, more than 0 and at most 1000000 (fractions allowed), not '{s}'"
        )),
    }
}

/// An I/O error's reason without Rust's " (os error N)" suffix, and with
/// the option that helps where the image library's error calls for one (the
/// library knows images, not command lines).
pub fn reason(e: &io::Error) -> String {
    if e.get_ref()
        .is_some_and(|inner| inner.is::<blkimage::nbd::PassphraseNeeded>())
    {
        return format!("{e}: give it with --secret-file FILE");
    }
    let s = e.to_string();
    if e.kind() == io::ErrorKind::ResourceBusy && s.starts_with("in use") {
        // The library knows the lock, the command its option.
        return format!("{s}; -U (--force-share) reads it anyway");
    }
    match s.rsplit_once(" (os error ") {
        Some((msg, _)) => msg.to_string(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("k").is_err());
        assert!(parse_size("1x").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("99999999999g").is_err());
        assert_eq!(parse_block_size("64m"), Ok(64 << 20));
        assert_eq!(parse_block_size("4KiB"), Ok(4096));
        assert!(parse_block_size("1000").is_err());
        assert!(parse_block_size("128m").is_err());
        assert!(parse_block_size("0").is_err());
    }

    #[test]
    fn reasons() {
        let e = io::Error::from_raw_os_error(2);
        assert_eq!(reason(&e), "No such file or directory");
        assert_eq!(reason(&io::Error::other("bad")), "bad");
        let luks = io::Error::new(io::ErrorKind::InvalidInput, blkimage::nbd::PassphraseNeeded);
        assert!(reason(&luks).ends_with("--secret-file FILE"), "{luks}");
    }
}
