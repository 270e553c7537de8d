//! HTTP(S): images read where they are published, over range requests.
//!
//! A URL is a file like any other here: [`Http`] is a qcow2 reader's
//! [`Storage`] (only the header, the tables and the allocated clusters are
//! asked for) and a raw image's [`Source`](crate::Source). This module decides ranges,
//! connections and retries; the formats are the qcow2 reader's and the
//! raw rules' (a size rounded up to 512 as QEMU does), so a URL hashes to
//! the checksum of the same file on disk.
//!
//! - **One version.** The first request (`Range: bytes=0-65535`, a GET:
//!   an S3 presigned URL is signed for GET, not HEAD) gives the length,
//!   the `ETag` and `Last-Modified`. Every later range asks the server to
//!   refuse another version ([`Version::condition`]) and every reply is
//!   checked: status 206, a `Content-Range` that is exactly the range
//!   asked for in a file of the same length, the same validators, a body
//!   of exactly that many bytes. Another version ends the read: "changed
//!   while it was read".
//! - **Retries.** A reset or dropped connection, a timeout, 408, 429, 502,
//!   503 or 504 ask again for the same range, [`HttpOptions::retries`]
//!   times (the first at once: a keep-alive connection the server closed;
//!   then after 0.25, 0.5, 1, 2, 4 s), then fail naming the range and the
//!   last error.
//! - **Redirects** are followed at open, at most 10, never from HTTPS to
//!   plain HTTP, and the target is where every range goes.
//! - **Servers without ranges** (a 200 with the whole body): a raw image
//!   is read as one stream (padded to 512 as a file is); qcow2 is refused.
//! - **Connections**: one per reading thread, kept alive. Ranges of a
//!   plain `http://` file without a proxy are read on connections of our
//!   own, the body straight from the socket into the buffer hashed
//!   (`direct.rs`: no copy out of a client's buffer); the
//!   first request, HTTPS, proxies and any reply framed otherwise go
//!   through ureq's pool. TLS with rustls, trusting what
//!   [`HttpOptions::tls_certificates`] names (a CA file, or a directory as
//!   for `nbds://`) or the system's CAs; a proxy from `https_proxy`,
//!   `http_proxy`, `all_proxy` and `no_proxy` as curl reads them.
//!
//! ```no_run
//! use blkimage::{open, Input, OpenOptions};
//! let input = open("https://images.example/disk.qcow2", &OpenOptions::default()).unwrap();
//! if let Input::Image(src) = input {
//!     println!("{} bytes of {}", src.size(), src.format());
//! }
//! ```

mod client;
mod direct;
mod fuzz;
mod headers;
mod interim;
mod reply;
mod url;

pub use fuzz::{fuzz_direct, fuzz_reply};
use headers::check_header;
pub use headers::{parse_header, read_headers};
pub use reply::{ContentRange, ETag, Version, check_range};
pub use url::{HttpUrl, is_url, redact, url_scheme};

use super::Storage;
use crate::source::{Origin, Remote};
use client::{Client, Fail, read_body};
use reply::RangeError;
use std::io::{self, Read};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How to reach HTTP(S) servers.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// Seconds a server may take to connect, to begin a reply, or to send
    /// a whole range (a trickle is a timeout): then the request fails (and
    /// is tried again). `None`: no limit.
    pub timeout: Option<Duration>,
    /// The CAs to trust instead of the system's: a PEM file, a directory
    /// with `ca-cert.pem` (and optionally `client-cert.pem` and
    /// `client-key.pem`), or a directory of CA certificates.
    pub tls_certificates: Option<PathBuf>,
    /// Headers sent with every request to the URL's own host (a redirect
    /// elsewhere gets none): `Authorization: Bearer ...`. See
    /// [`parse_header`].
    pub headers: Vec<(String, String)>,
    /// Tries after the first for a request that failed transiently.
    pub retries: u32,
}

/// Retries of a failed request by default (5 tries in all).
pub const DEFAULT_RETRIES: u32 = 4;

impl Default for HttpOptions {
    fn default() -> HttpOptions {
        HttpOptions {
            timeout: None,
            tls_certificates: None,
            headers: Vec::new(),
            retries: DEFAULT_RETRIES,
        }
    }
}

/// Bytes asked for by the first request: the header and tables of most
/// qcow2 images, and the signatures of the other formats, in one round
/// trip. They are kept and never asked for again.
const HEAD: u64 = 64 << 10;

/// Redirects followed at most.
pub const MAX_REDIRECTS: usize = 10;

/// Bytes of reads a URL keeps in flight by default at least, as an NBD
/// export does (`NBD_BYTES_IN_FLIGHT`): 16 reads of the default 1 MiB, each
/// on a connection of its own, to hide the network's latency...
const HTTP_BYTES_IN_FLIGHT: usize = 16 << 20;
/// ...more across a longer round trip: what keeps this many bytes a second
/// coming while each request waits for its reply (the first request's
/// time: 16 MiB up to 3 ms, 23 MiB at 5 ms, 46 MiB at 10 ms): more than
/// the digests take on two cores, since a reply also waits for its turn
/// at the server and in the client (at 10 ms, 32 MiB in flight took 1.11x
/// the time of 46 MiB)...
const HTTP_BYTES_PER_SECOND: f64 = 4.8e9;
/// ...up to this many (the buffers hold these and up to 16 MiB of reads
/// waiting for the digests, 64 MiB in all: see `readahead::MOST_HELD`)...
const HTTP_MAX_BYTES_IN_FLIGHT: usize = 64 << 20;
/// ...and up to this many reads when they are smaller (a qcow2 image's
/// scattered clusters: each a request that waits the whole latency).
const HTTP_READS_IN_FLIGHT: usize = 64;

/// Bytes of reads in flight by default for a server whose first reply took
/// `round_trip` (from the request to the reply's head, the connection's
/// setup included: a little more than the network's round trip, which
/// errs on the side of more in flight).
fn bytes_in_flight(round_trip: Duration) -> usize {
    let wanted = round_trip.as_secs_f64() * HTTP_BYTES_PER_SECOND;
    (wanted as usize).clamp(HTTP_BYTES_IN_FLIGHT, HTTP_MAX_BYTES_IN_FLIGHT)
}

/// Another version of the file than the one opened, in the words the
/// commands print.
fn changed(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("changed while it was read: {why}"),
    )
}

/// The pause before try `n` (1 for the first retry).
fn backoff(n: u32) -> Duration {
    match n {
        0 | 1 => Duration::ZERO,
        n => Duration::from_millis(250 << (n - 2).min(4)),
    }
}

/// Run `f` until it succeeds, fails for good, or failed `retries + 1`
/// times; `what` names the request in the last error.
fn with_retries<T>(
    retries: u32,
    what: impl Fn() -> String,
    mut f: impl FnMut() -> Result<T, Fail>,
) -> io::Result<T> {
    let mut tries = 0;
    loop {
        tries += 1;
        match f() {
            Ok(v) => return Ok(v),
            Err(Fail::Final(e)) => return Err(e),
            Err(Fail::Again(e)) if tries > retries => {
                let n = if tries == 1 {
                    "1 try".to_string()
                } else {
                    format!("{tries} tries")
                };
                return Err(io::Error::new(
                    e.kind(),
                    format!("{}: {n} failed, the last: {e}", what()),
                ));
            }
            Err(Fail::Again(_)) => std::thread::sleep(backoff(tries)),
        }
    }
}

/// What a server's reply header `name` holds, if it is there and text.
fn header<'a>(resp: &'a ureq::http::Response<ureq::Body>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

/// A reply's headers, looked up by name (ureq's or [`direct`]'s).
type Headers<'a, 'b> = &'a dyn Fn(&str) -> Option<&'b str>;

/// The server refused the request for want of credentials, or refused the
/// ones sent (401 or 403; the `io::Error`'s inner error, of kind
/// [`io::ErrorKind::PermissionDenied`]): a program recognizes it to name
/// its own way of passing them (the library names only the URL's).
#[derive(Debug)]
pub struct Unauthorized {
    /// "HTTP 401 Unauthorized" or "HTTP 403 Forbidden".
    status: String,
    /// The URL is a KubeVirt VirtualMachineExport's volume
    /// (`.../volumes/PVC/disk.img` or `disk.img.gz`), whose token goes in
    /// a header of its own.
    export: bool,
}

impl Unauthorized {
    /// True if the URL is a KubeVirt VirtualMachineExport's volume, whose
    /// server wants its token in the `x-kubevirt-export-token` header (or
    /// query parameter) rather than in `Authorization`.
    pub fn wants_export_token(&self) -> bool {
        self.export
    }
}

/// The header (and query parameter) a KubeVirt VirtualMachineExport's
/// server takes its token from.
pub const KUBEVIRT_EXPORT_TOKEN: &str = "x-kubevirt-export-token";

impl std::fmt::Display for Unauthorized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.export {
            return write!(
                f,
                "{}: the export server wants its token, or refused the one sent: pass it in a \
                 header ({KUBEVIRT_EXPORT_TOKEN}: TOKEN) or in the URL \
                 (?{KUBEVIRT_EXPORT_TOKEN}=TOKEN)",
                self.status
            );
        }
        write!(
            f,
            "{}: the server wants credentials, or refused those sent: pass them in a header \
             (Authorization: Bearer TOKEN) or in the URL (https://USER:PASSWORD@HOST/...)",
            self.status
        )
    }
}

impl std::error::Error for Unauthorized {}

/// An error for a status of a reply from `url` that is neither a success
/// nor worth a retry.
fn status_error(status: u16, url: &HttpUrl) -> Fail {
    let reason = ureq::http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason());
    let said = format!("HTTP {status} {}", reason.unwrap_or(""))
        .trim_end()
        .to_string();
    if matches!(status, 401 | 403) {
        return Fail::Final(io::Error::new(
            io::ErrorKind::PermissionDenied,
            Unauthorized {
                status: said,
                export: url.is_kubevirt_export(),
            },
        ));
    }
    let kind = match status {
        404 | 410 => io::ErrorKind::NotFound,
        _ => io::ErrorKind::Other,
    };
    Fail::final_with(kind, said)
}

/// Statuses worth another try: the server or a gateway is busy or
/// restarting.
fn transient(status: u16) -> bool {
    matches!(status, 408 | 429 | 502 | 503 | 504)
}

/// A reply whose body is encoded (gzip...) holds other bytes than the file.
fn identity(h: Headers) -> Result<(), Fail> {
    match h("content-encoding") {
        None => Ok(()),
        Some(e) if e.trim().eq_ignore_ascii_case("identity") => Ok(()),
        Some(e) => Err(Fail::final_with(
            io::ErrorKind::InvalidData,
            format!("the server encoded the reply ({e}), which was asked for as it is stored"),
        )),
    }
}

/// A file behind an HTTP(S) URL whose server answers range requests: a
/// qcow2 reader's [`Storage`] and a raw image's [`Source`](crate::Source) (its size
/// rounded up to 512, as a raw file's).
pub struct Http {
    client: Client,
    /// Where ranges are asked for: the URL after its redirects.
    target: HttpUrl,
    /// The URL as given (names beside it resolve against it, as QEMU's
    /// curl driver, which follows redirects inside curl, resolves them).
    url: HttpUrl,
    /// For a file below the image (a backing or data file): what read
    /// errors are prefixed with, since the command names only the image.
    context: Option<String>,
    version: Version,
    /// The first bytes, from the first request.
    head: Vec<u8>,
    retries: u32,
    /// How long the first request took to be answered: the reads kept in
    /// flight hide it ([`bytes_in_flight`]).
    round_trip: Duration,
    /// Ranges read on connections of our own, for plain HTTP without a
    /// proxy (see [`direct`]).
    direct: Option<direct::Direct>,
}

/// A server's answer to the first request.
pub(crate) enum Opening {
    /// It honours ranges.
    Ranges(Box<Http>),
    /// It sent the whole file (200): its length if said, and the body.
    Whole(Whole),
}

impl Http {
    /// Open `url`: follow its redirects, take its length and validators,
    /// and keep its first bytes. A server that does not answer ranges is
    /// an error (a qcow2 image needs them).
    pub fn open(url: &HttpUrl, opts: &HttpOptions) -> io::Result<Http> {
        match open_url(url, opts)? {
            Opening::Ranges(h) => Ok(*h),
            Opening::Whole(_) => Err(no_ranges("it is a file an image refers to")),
        }
    }

    /// The URL as given.
    pub fn url(&self) -> &HttpUrl {
        &self.url
    }

    /// The URL ranges are asked from (the given one after its redirects).
    pub fn target(&self) -> &HttpUrl {
        &self.target
    }

    /// The first bytes, which the first request brought.
    pub(crate) fn head(&self) -> &[u8] {
        &self.head
    }

    /// The version opened: length and validators.
    pub fn version(&self) -> &Version {
        &self.version
    }

    /// Where its bytes come from: its URL without secrets
    /// ([`HttpUrl::recorded`]) and the version opened (length, ETag and
    /// Last-Modified, if the server gave them).
    pub fn remote(&self) -> Remote {
        Remote {
            kind: "http".into(),
            what: "file".into(),
            name: vec![self.url.recorded()],
            version: vec![
                ("length".into(), Some(self.version.len.to_string())),
                ("ETag".into(), self.version.etag.as_ref().map(ETag::value)),
                ("Last-Modified".into(), self.version.last_modified.clone()),
            ],
        }
    }

    /// Name read errors as those of `what` ("backing file 'URL'").
    pub(crate) fn set_context(&mut self, what: String) {
        self.context = Some(what);
    }

    fn in_context(&self, e: io::Error) -> io::Error {
        match &self.context {
            Some(c) => io::Error::new(e.kind(), format!("{c}: {e}")),
            None => e,
        }
    }

    /// Fill `buf` with the file's bytes at `offset` (inside the file):
    /// what the first request brought is not asked for again.
    pub(crate) fn fetch(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let kept = (self.head.len() as u64).saturating_sub(offset);
        let (buf, offset) = match usize::try_from(kept).map_or(buf.len(), |k| k.min(buf.len())) {
            0 => (buf, offset),
            n => {
                let at = offset as usize;
                buf[..n].copy_from_slice(&self.head[at..at + n]);
                (&mut buf[n..], offset + n as u64)
            }
        };
        if buf.is_empty() {
            return Ok(());
        }
        let last = offset + buf.len() as u64 - 1;
        with_retries(
            self.retries,
            || format!("bytes {offset}-{last}"),
            || self.try_range(buf, offset, last),
        )
        .map_err(|e| self.in_context(e))
    }

    /// One request for bytes `offset..=last` into `buf`: on a plain HTTP
    /// connection of our own where the reply allows ([`direct`]), else
    /// through ureq.
    fn try_range(&self, buf: &mut [u8], offset: u64, last: u64) -> Result<(), Fail> {
        let mut extra = vec![("Range", format!("bytes={offset}-{last}"))];
        extra.extend(self.version.condition());
        let deadline = self.client.timeout().map(|t| Instant::now() + t);
        if let Some(direct) = &self.direct {
            let check = |status: u16, h: Headers| self.check_reply(status, h, offset, last);
            if direct.range(&extra, buf, deadline, check)? == direct::Read::Done {
                return Ok(());
            }
        }
        let mut resp = self.client.get(&self.target, &extra)?;
        self.check_reply(resp.status().as_u16(), &|n| header(&resp, n), offset, last)?;
        let mut body = resp.body_mut().as_reader();
        read_body(&mut body, buf, deadline, self.client.timeout())
    }

    /// Whether a reply of `status` with the headers `h` brings bytes
    /// `offset..=last` of the version opened, and nothing else. (A reply
    /// refused here is dropped unread: its connection closes, and a whole
    /// file sent by a 200 is not read.)
    fn check_reply(&self, status: u16, h: Headers, offset: u64, last: u64) -> Result<(), Fail> {
        match status {
            206 => {}
            200 => {
                let why = self.version.differs(h("etag"), h("last-modified"));
                return Err(Fail::Final(match why {
                    Some(why) => changed(&why),
                    None => io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "the server sent the whole file (200) for bytes {offset}-{last}: \
                             it stopped honouring ranges"
                        ),
                    ),
                }));
            }
            412 => {
                return Err(Fail::Final(changed(
                    "the server says it is no longer the version opened (412 Precondition Failed)",
                )));
            }
            416 => {
                return Err(Fail::Final(changed(&format!(
                    "the server says bytes {offset}-{last} are past its end (416), it was {} bytes",
                    self.version.len
                ))));
            }
            s if transient(s) => return Err(Fail::Again(status_error(s, &self.url).into_error())),
            300..=399 => {
                return Err(Fail::final_with(
                    io::ErrorKind::InvalidData,
                    format!("the server redirects ({status}) a range it served before"),
                ));
            }
            s => return Err(status_error(s, &self.url)),
        }
        identity(h)?;
        check_range(
            &self.version,
            offset,
            last,
            h("content-range"),
            h("etag"),
            h("last-modified"),
        )
        .map_err(|e| match e {
            RangeError::Changed(why) => Fail::Final(changed(&why)),
            RangeError::Wrong(why) => Fail::final_with(io::ErrorKind::InvalidData, why),
        })?;
        let len = last - offset + 1;
        if let Some(n) = h("content-length").filter(|n| n.parse() != Ok(len)) {
            return Err(Fail::final_with(
                io::ErrorKind::InvalidData,
                format!("a reply of Content-Length {n} for the {len} bytes {offset}-{last}"),
            ));
        }
        Ok(())
    }
}

pub(crate) fn no_ranges(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "the server does not answer range requests (it sent the whole file for the first \
             bytes), and {what}, which is read by ranges: download it first \
             (curl -o FILE URL) and hash FILE"
        ),
    )
}

/// The first request of `url`: its redirects followed, its answer taken.
pub(crate) fn open_url(url: &HttpUrl, opts: &HttpOptions) -> io::Result<Opening> {
    let mut client = Client::new(url, url, opts)?;
    let mut at = url.clone();
    let mut redirects = 0;
    loop {
        let (resp, took) = first_request(&client, url, &at, opts)?;
        let status = resp.status().as_u16();
        if matches!(status, 301 | 302 | 303 | 307 | 308) {
            let location = header(&resp, "location").ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a redirect ({status}) without a Location"),
                )
            })?;
            let next = at.redirect(location)?;
            redirects += 1;
            if redirects > MAX_REDIRECTS {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "more than {MAX_REDIRECTS} redirects (a loop?), the last to {}",
                        next.shown()
                    ),
                ));
            }
            if next.is_https() != at.is_https() {
                // Another scheme: another proxy, and TLS.
                client = Client::new(url, &next, opts)?;
            }
            at = next;
            continue;
        }
        return match status {
            206 | 416 => {
                let mut http = first_range(client, url, at, resp, opts)?;
                http.round_trip = took;
                Ok(Opening::Ranges(Box::new(http)))
            }
            200 => Ok(Opening::Whole(Whole::new(resp)?)),
            // The range request itself refused (as a server that takes no
            // HEAD answers one): the file asked for once without a range,
            // to be read as a stream if it comes whole.
            400 | 405 | 501 => whole_after(&client, url, &at, opts),
            _ => Err(status_error(status, url).into_error()),
        };
    }
}

/// The first request of `at` (`given`, or where it redirects): the reply
/// (its head), and how long it took to come.
fn first_request(
    client: &Client,
    given: &HttpUrl,
    at: &HttpUrl,
    opts: &HttpOptions,
) -> io::Result<(ureq::http::Response<ureq::Body>, Duration)> {
    let range = [("Range", format!("bytes=0-{}", HEAD - 1))];
    with_retries(
        opts.retries,
        || "the first request".to_string(),
        || {
            let asked = Instant::now();
            let resp = client.get(at, &range)?;
            let status = resp.status().as_u16();
            if transient(status) {
                return Err(Fail::Again(status_error(status, given).into_error()));
            }
            Ok((resp, asked.elapsed()))
        },
    )
}

/// `at` (`given` after its redirects) asked for once more, without a
/// range, after its server refused the first request: the whole file, as
/// a stream, or the error its status says.
fn whole_after(
    client: &Client,
    given: &HttpUrl,
    at: &HttpUrl,
    opts: &HttpOptions,
) -> io::Result<Opening> {
    let resp = with_retries(
        opts.retries,
        || "the request without a range".to_string(),
        || {
            let resp = client.get(at, &[])?;
            match resp.status().as_u16() {
                s if transient(s) => Err(Fail::Again(status_error(s, given).into_error())),
                _ => Ok(resp),
            }
        },
    )?;
    match resp.status().as_u16() {
        200 => Ok(Opening::Whole(Whole::new(resp)?)),
        s => Err(status_error(s, given).into_error()),
    }
}

/// The answer to the first range request (206, or 416 for an empty file)
/// as an open file.
fn first_range(
    client: Client,
    given: &HttpUrl,
    url: HttpUrl,
    mut resp: ureq::http::Response<ureq::Body>,
    opts: &HttpOptions,
) -> io::Result<Http> {
    let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
    identity(&|n| header(&resp, n)).map_err(Fail::into_error)?;
    let value = header(&resp, "content-range").unwrap_or("");
    let (len, last) = match (resp.status().as_u16(), ContentRange::parse(value)) {
        (416, Some(ContentRange::Unsatisfied { complete: 0 })) => (0, None),
        (
            206,
            Some(ContentRange::Bytes {
                first: 0,
                last,
                complete: Some(len),
            }),
        ) if last == len.min(HEAD) - 1 => (len, Some(last)),
        (status, _) => {
            return Err(bad(format!(
                "the server answered the first {HEAD} bytes with {status} and Content-Range '{}'",
                value.escape_debug()
            )));
        }
    };
    let version = Version {
        len,
        etag: header(&resp, "etag").and_then(ETag::parse),
        last_modified: header(&resp, "last-modified").map(str::to_string),
    };
    let mut head = blkhash::try_zeroed(last.map_or(0, |l| l as usize + 1), "the first bytes")?;
    if last.is_some() {
        let deadline = opts.timeout.map(|t| Instant::now() + t);
        read_body(
            &mut resp.body_mut().as_reader(),
            &mut head,
            deadline,
            opts.timeout,
        )
        .map_err(Fail::into_error)?;
    }
    Ok(Http {
        direct: direct::Direct::new(&client, &url),
        client,
        url: given.clone(),
        target: url,
        context: None,
        version,
        head,
        retries: opts.retries,
        round_trip: Duration::ZERO,
    })
}

impl Storage for Http {
    fn len(&self) -> u64 {
        self.version.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match offset.checked_add(buf.len() as u64) {
            Some(end) if end <= self.version.len => self.fetch(buf, offset),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {} bytes at offset {offset:#x} is past the end ({:#x} bytes)",
                    buf.len(),
                    self.version.len
                ),
            )),
        }
    }

    fn origin(&self) -> Vec<Origin> {
        vec![Origin::Remote(self.remote())]
    }

    /// Up to 64 reads in flight, 16 to 64 MiB of them as the round trip
    /// asks ([`Storage::bytes_in_flight`]): latency, not the digest
    /// threads, bounds a file across a network, and a small read waits as
    /// long as a large one.
    fn default_io_depth(&self, read_size: usize) -> Option<usize> {
        let _ = read_size;
        Some(HTTP_READS_IN_FLIGHT)
    }

    fn bytes_in_flight(&self) -> Option<usize> {
        Some(bytes_in_flight(self.round_trip))
    }
}

/// The whole file, from a server that does not answer ranges: read once,
/// start to end, then padded with zeros to a multiple of 512 as a raw file
/// of that length is hashed (unless told not to: a compressed file, or [`crate::OpenOptions::exact_size`]). A body shorter or
/// longer than its `Content-Length` is an error.
pub struct Whole {
    body: ureq::BodyReader<'static>,
    len: Option<u64>,
    got: u64,
    /// Zeros still to give after the body.
    pad: Option<u64>,
    /// The body is padded to a multiple of 512 (a raw image's bytes).
    round: bool,
}

impl Whole {
    fn new(resp: ureq::http::Response<ureq::Body>) -> io::Result<Whole> {
        identity(&|n| header(&resp, n)).map_err(Fail::into_error)?;
        let len = header(&resp, "content-length").and_then(|n| n.parse().ok());
        Ok(Whole {
            body: resp.into_body().into_reader(),
            len,
            got: 0,
            pad: None,
            round: true,
        })
    }

    /// Whether the body is padded to a multiple of 512 (it is unless
    /// told): not the bytes of a compressed file. Said before the body's
    /// end is read.
    pub(crate) fn set_padded(&mut self, on: bool) {
        self.round = on;
    }
}

impl Read for Whole {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(pad) = &mut self.pad {
            let n = (*pad).min(buf.len() as u64) as usize;
            buf[..n].fill(0);
            *pad -= n as u64;
            return Ok(n);
        }
        let n = self.body.read(buf)?;
        self.got += n as u64;
        if let Some(len) = self
            .len
            .filter(|&l| self.got > l || (n == 0 && self.got < l))
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the reply has {} bytes where its Content-Length says {len}",
                    self.got
                ),
            ));
        }
        if n == 0 && self.round {
            self.pad = Some(self.got.next_multiple_of(512) - self.got);
            return self.read(buf);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_in_flight_follow_the_round_trip() {
        let at = |ms| bytes_in_flight(Duration::from_millis(ms));
        // Nearby (loopback, 2 ms across a relay): as before.
        for ms in [0, 1, 2, 3] {
            assert_eq!(at(ms), 16 << 20, "{ms} ms");
        }
        assert!((22 << 20..=23 << 20).contains(&at(5)), "{}", at(5));
        assert!((45 << 20..=46 << 20).contains(&at(10)), "{}", at(10));
        assert_eq!(at(20), 64 << 20);
        assert_eq!(at(1000), 64 << 20);
    }
}
