//! Opening a URL: the first request, the format probed from the bytes it
//! brought, and a qcow2 image's chain (`super::chain`) or a virtnbdbackup
//! stream's (`super::vnbd`) named relative to the URL.

use super::chain;
use super::{Format, Input, OpenOptions};
use crate::formats::{qcow2, qemu};
use crate::storage::compressed::{Compression, Forward};
use crate::storage::http::{Http, HttpUrl, Opening, Whole, no_ranges, open_url};
use std::io::{self, Read};

/// Open the image at `url` as [`crate::open`] does.
pub(crate) fn open(name: &str, opts: &OpenOptions) -> io::Result<Input> {
    let url = HttpUrl::parse(name)?;
    let http = match open_url(&url, &opts.http)? {
        Opening::Ranges(h) => *h,
        Opening::Whole(whole) => return open_whole(whole, opts),
    };
    if let Some(kind) = compressed_probe(http.head(), opts) {
        return open_compressed_ranges(kind, http, opts);
    }
    let stream = crate::formats::vnbd::probe(http.head());
    match opts.format {
        None | Some(Format::Virtnbdbackup) if stream => {
            return Ok(Input::Image(Box::new(super::vnbd::open_url(http, opts)?)));
        }
        Some(Format::Virtnbdbackup) => return Err(super::not_a_stream()),
        _ => {}
    }
    let format = match opts.format {
        Some(f) => f,
        None => probe(&http)?,
    };
    match format {
        Format::Raw => Ok(Input::Image(Box::new(http))),
        Format::Qcow2 => {
            let mut chain = vec![http.url().recorded()];
            let image = chain::open_remote(std::sync::Arc::new(http), opts, &mut chain)?;
            Ok(Input::Image(Box::new(image)))
        }
        Format::Qemu(f) => Err(other_format(f)),
        Format::Virtnbdbackup => Err(super::not_a_stream()),
    }
}

/// A format read through QEMU (vmdk, vdi...), which is not read over HTTP.
fn other_format(f: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "a {f} image: over HTTP(S) only raw and qcow2 images and virtnbdbackup streams \
             are read; download it \
             (curl -o FILE URL) and hash FILE, or convert it to qcow2 where it is published"
        ),
    )
}

/// The format of a file with ranges, from its first bytes (and its last
/// 512, for the formats QEMU tells by a trailer), as a file's is probed.
fn probe(http: &Http) -> io::Result<Format> {
    let head = &http.head()[..http.head().len().min(512)];
    if qcow2::probe_bytes(head) {
        return Ok(Format::Qcow2);
    }
    let len = http.version().len;
    let tail = |at: u64, n: usize| {
        let mut b = vec![0u8; n];
        http.fetch(&mut b, at).ok().map(|()| b)
    };
    match qemu::probe_bytes(head, len, tail)? {
        Some(f) => Ok(Format::Qemu(f)),
        None => Ok(Format::Raw),
    }
}

/// A whole-file reply as an input: raw bytes, as a stream; anything that
/// needs ranges refused.
fn open_whole(mut whole: Whole, opts: &OpenOptions) -> io::Result<Input> {
    let format = opts.format;
    let mut head = Vec::with_capacity(512);
    // The head as sent, in case it is compressed.
    whole.set_padded(false);
    (&mut whole).take(512).read_to_end(&mut head)?;
    if let Some(kind) = compressed_probe(&head, opts) {
        let r = Box::new(io::Cursor::new(head).chain(whole));
        return super::compressed::open(kind, r, Vec::new(), opts);
    }
    // Padded to 512 as a raw file is, unless the exact bytes are asked
    // for (`OpenOptions::exact_size`).
    whole.set_padded(!opts.exact_size);
    let probed = if qcow2::probe_bytes(&head) {
        Some(Format::Qcow2)
    } else {
        qemu::probe_bytes(&head, 0, |_, _| None)?.map(Format::Qemu)
    };
    let stream = crate::formats::vnbd::probe(&head);
    if matches!(format, None | Some(Format::Virtnbdbackup)) && stream {
        return Err(no_ranges("the file is a virtnbdbackup stream"));
    }
    match format.or(probed) {
        Some(Format::Qcow2) => Err(no_ranges("the image is qcow2")),
        Some(Format::Qemu(f)) => Err(other_format(f)),
        Some(Format::Virtnbdbackup) => Err(super::not_a_stream()),
        _ => Ok(Input::Stream(Box::new(io::Cursor::new(head).chain(whole)))),
    }
}

// Compressed files (gzip, xz, zstd) at a URL: read forward as a stream,
// whether the server answered with ranges or with the whole file
// (`super::compressed` opens the image inside).

/// The compression `head` (a URL's first bytes) starts with, unless a
/// format is forced (`-f raw` hashes the bytes as they are).
fn compressed_probe(head: &[u8], opts: &OpenOptions) -> Option<Compression> {
    opts.format
        .is_none()
        .then(|| Compression::probe(head))
        .flatten()
}

/// The image compressed with `kind` at `http` (a file with ranges), read
/// forward one range after the other.
fn open_compressed_ranges(kind: Compression, http: Http, opts: &OpenOptions) -> io::Result<Input> {
    let origin = crate::Storage::origin(&http);
    let r = Box::new(Forward::new(http));
    super::compressed::open(kind, r, origin, opts)
}
