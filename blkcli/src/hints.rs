//! What a command adds to the libraries' messages. The libraries know
//! images, digests and servers, not command lines: where their error calls
//! for an option, the error is typed ([`blkimage::PassphraseNeeded`],
//! [`blkimage::nbd::RawOnly`], [`blkimage::nbd::NoCaCertificates`],
//! [`blkimage::nbd::UnknownIssuer`], [`blkimage::http::Unauthorized`],
//! [`blkhash::UnknownAlgorithm`], an image in use) and the command names
//! its option here, the same way in every command.

use std::io;

/// `reason`, the library's words for `e`, with the option that helps
/// where `e` calls for one.
///
/// ```
/// use std::io;
/// let e = io::Error::new(io::ErrorKind::InvalidInput, blkimage::nbd::RawOnly);
/// assert_eq!(
///     blkcli::hints::with_option(&e, e.to_string()),
///     "an NBD export is read as raw bytes (only -f raw applies)"
/// );
/// ```
pub fn with_option(e: &io::Error, reason: String) -> String {
    if is::<blkimage::PassphraseNeeded>(e) {
        return format!("{reason}: give it with --secret-file FILE");
    }
    if is::<blkimage::nbd::RawOnly>(e) {
        return format!("{reason} (only -f raw applies)");
    }
    if is::<blkimage::nbd::NoCaCertificates>(e) {
        return format!(
            "{reason} (--tls-certificates FILE|DIR, or tls-certificates=DIR in the URL)"
        );
    }
    if is::<blkimage::nbd::UnknownIssuer>(e) {
        return format!("{reason} (--tls-certificates FILE|DIR)");
    }
    if let Some(i) = blkimage::cause::<blkjob::IndexOnly>(e) {
        // As lines::size_word writes it (which imports this module).
        let bs = match i.chunk_size {
            n if n.is_multiple_of(1 << 20) => format!("{}m", n >> 20),
            n if n.is_multiple_of(1024) => format!("{}k", n >> 10),
            n => n.to_string(),
        };
        let pbs = match bs.as_str() {
            "4m" => "--construction pbs".to_string(),
            _ => format!("--construction pbs --block-size {bs}"),
        };
        return format!("{reason} ({pbs}, or -d sha256 --block-size {bs})");
    }
    if let Some(u) = blkimage::cause::<blkimage::http::Unauthorized>(e) {
        if u.wants_export_token() {
            return format!(
                "{reason} (--header '{}: TOKEN', or --header @FILE to keep it out of ps)",
                blkimage::http::KUBEVIRT_EXPORT_TOKEN
            );
        }
        return format!("{reason} (--header 'Authorization: ...')");
    }
    if e.kind() == io::ErrorKind::TimedOut {
        // A server too slow for the limit the command set.
        return format!("{reason} (--timeout)");
    }
    if e.kind() == io::ErrorKind::ResourceBusy && reason.starts_with("in use") {
        // The library knows the lock, the command its option.
        return format!("{reason}; -U (--force-share) reads it anyway");
    }
    reason
}

/// True if `e` is the library's typed error `T`, under any context.
fn is<T: std::error::Error + 'static>(e: &io::Error) -> bool {
    blkimage::caused_by::<T>(e)
}

/// An unknown digest's message, with the option that lists the known ones.
///
/// ```
/// let e = "sha257".parse::<blkhash::Algorithm>().unwrap_err();
/// assert_eq!(
///     blkcli::hints::unknown_digest(&e),
///     "unknown digest 'sha257' (see --list-digests)"
/// );
/// ```
pub fn unknown_digest(e: &blkhash::UnknownAlgorithm) -> String {
    format!("{e} (see --list-digests)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(e: io::Error) -> String {
        with_option(&e, e.to_string())
    }

    #[test]
    fn options_named() {
        let luks = io::Error::new(io::ErrorKind::InvalidInput, blkimage::PassphraseNeeded);
        assert_eq!(
            said(luks),
            "a LUKS image needs its passphrase: give it with --secret-file FILE"
        );
        let busy = io::Error::new(io::ErrorKind::ResourceBusy, "in use: qemu-nbd: locked");
        assert_eq!(
            said(busy),
            "in use: qemu-nbd: locked; -U (--force-share) reads it anyway"
        );
        let slow = io::Error::new(io::ErrorKind::TimedOut, "no answer within 1 seconds");
        assert_eq!(said(slow), "no answer within 1 seconds (--timeout)");
        let other = io::Error::new(io::ErrorKind::ResourceBusy, "busy");
        assert_eq!(said(other), "busy");
        assert_eq!(said(io::Error::other("bad")), "bad");
    }
}
