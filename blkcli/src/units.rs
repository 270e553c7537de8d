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

/// A timeout in seconds (fractions allowed), more than 0 and at most 10^6.
pub fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    match s.parse::<f64>() {
        Ok(t) if t > 0.0 && t <= 1e6 => Ok(std::time::Duration::from_secs_f64(t)),
        _ => Err(format!(
            "timeout must be seconds from 0 to 1000000, not '{s}'"
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
