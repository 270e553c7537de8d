//! What the commands share when they read sizes and report errors: one
//! implementation, so that blksum, blkmap, blkdiff and blksync take the same
//! spellings and say the same things.

pub use blkjob::Span;
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

/// A block size: a multiple of 512 from 512 to 64m (the rule is
/// [`blkjob::check_block_size`]'s).
pub fn parse_block_size(s: &str) -> Result<usize, String> {
    let n = parse_size(s)?;
    let n = usize::try_from(n).map_err(|_| blkjob::JobError::BlockSize(n).to_string())?;
    blkjob::check_block_size(n).map_err(|e| e.to_string())
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

/// An I/O error's reason without Rust's " (os error N)" suffix
/// ([`blkjob::reason`]), and with the option that helps where the
/// library's error calls for one ([`crate::hints::with_option`]: the
/// library knows images, not command lines).
pub fn reason(e: &io::Error) -> String {
    crate::hints::with_option(e, blkjob::reason(e))
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
        let luks = io::Error::new(io::ErrorKind::InvalidInput, blkimage::PassphraseNeeded);
        assert!(reason(&luks).ends_with("--secret-file FILE"), "{luks}");
    }
}
