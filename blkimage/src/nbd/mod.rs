//! NBD: a client for NBD URLs (`nbd://`, `nbd+unix://`, `nbds://`,
//! `nbds+unix://`). (Image formats read through a private `qemu-nbd` are
//! an image backend of their own: [`crate::QemuExport`].)
//!
//! The protocol is written from the NBD project's `doc/proto.md`: the fixed
//! newstyle handshake with NBD_OPT_GO (block size constraints honoured),
//! optional TLS (NBD_OPT_STARTTLS, rustls), structured replies, the
//! base:allocation metadata context and block status, many requests in
//! flight, several connections when the server offers multi-conn. Old
//! servers (oldstyle, no NBD_OPT_GO, no structured replies, no block status)
//! work too: then everything is read.

mod connection;
mod handshake;
mod pending;
// The wire format is the client's business, public only to the fuzz checks
// (fuzz-checks): hidden, not API. Its constants are the spec's names
// (doc/proto.md says what each means).
#[doc(hidden)]
#[allow(missing_docs)]
pub mod protocol;
mod replies;
mod source;
pub(crate) mod tls;
mod transport;
mod url;

// Fuzz entry points (fuzz-checks): hidden, not API.
#[doc(hidden)]
pub use connection::fuzz_replies;
#[doc(hidden)]
pub use handshake::fuzz_handshake;
pub use source::{Nbd, NbdOptions};
pub use tls::{NoCaCertificates, UnknownIssuer};
pub use url::{Address, NbdUrl, is_url};

use std::io;

/// Opening an NBD URL in a format other than raw (the `io::Error`'s inner
/// error, [`io::ErrorKind::InvalidInput`]): an export is read as raw
/// bytes; a program recognizes it to say which of its options applies.
#[derive(Debug)]
pub struct RawOnly;

impl std::fmt::Display for RawOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an NBD export is read as raw bytes")
    }
}

impl std::error::Error for RawOnly {}

/// Open the NBD URL `name` (callers print the name with any error).
pub fn open_url(name: &str, opts: &NbdOptions) -> io::Result<Nbd> {
    Nbd::connect(&NbdUrl::parse(name)?, opts)
}
