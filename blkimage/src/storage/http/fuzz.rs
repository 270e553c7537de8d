//! The fuzz targets' entry points into the HTTP client's parsing of what
//! a server sends (`fuzz/fuzz_targets/http_reply.rs`, `http_direct.rs`).
//! Not API.

use super::client::Client;
use super::reply::{ContentRange, ETag, Version, check_range};
use super::url::HttpUrl;
use super::{Headers, Http, HttpOptions, direct};
use std::io::Read;
use std::time::Duration;

#[doc(hidden)]
/// Fuzz entry point: parse `data` as a server's `Content-Range`, `ETag`
/// and `Last-Modified` values and check a reply of them against a version;
/// panics if a parse breaks its contract. Not API.
pub fn fuzz_reply(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(4, '\n');
    let (cr, etag, lm) = (parts.next(), parts.next(), parts.next());
    if let Some(cr) = cr
        && let Some(r) = ContentRange::parse(cr)
    {
        match r {
            ContentRange::Bytes {
                first,
                last,
                complete,
            } => {
                assert!(first <= last);
                assert!(complete.is_none_or(|c| last < c));
            }
            ContentRange::Unsatisfied { .. } => {}
        }
        assert_eq!(ContentRange::parse(&r.to_string()), Some(r));
    }
    if let Some(e) = etag.and_then(ETag::parse) {
        assert_eq!(ETag::parse(&e.value()), Some(e.clone()));
    }
    let version = Version {
        len: 1 << 20,
        etag: etag.and_then(ETag::parse),
        last_modified: lm.map(str::to_string),
    };
    let _ = version.condition();
    assert_eq!(version.differs(etag, lm), None);
    let _ = check_range(&version, 0, 4095, cr, etag, lm);
}

#[doc(hidden)]
/// Fuzz entry point: `reply` is what a hostile server sends, and then
/// closes, for a range of 4096 bytes at 4096 of a 1 MiB file asked on a
/// connection of our own (the `direct` module: its head parsed, checked
/// and its body read into the buffer). Every outcome is fine but a panic,
/// a hang, or a range taken whose bytes are not in the reply as they
/// stand, without a Content-Length of exactly its size, or without a 206
/// (interim 1xx replies before it are read past). Not API.
pub fn fuzz_direct(reply: &[u8]) {
    use std::io::Write;
    use std::sync::mpsc::{Receiver, Sender, channel};
    use std::sync::{Mutex, OnceLock};
    // One server for every input: a listener per input would use up the
    // ephemeral ports (each closed connection waits in TIME_WAIT).
    type Server = (u16, Mutex<(Sender<Vec<u8>>, Receiver<()>)>);
    static SERVER: OnceLock<Server> = OnceLock::new();
    let (port, server) = SERVER.get_or_init(|| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (replies, to_send) = channel::<Vec<u8>>();
        let (served, done) = channel();
        std::thread::spawn(move || {
            for reply in to_send {
                if let Ok((mut s, _)) = listener.accept() {
                    // The request, up to its blank line, then the reply.
                    let mut got = Vec::new();
                    let mut byte = [0u8; 1];
                    while !got.ends_with(b"\r\n\r\n") && s.read(&mut byte).is_ok_and(|n| n == 1) {
                        got.push(byte[0]);
                    }
                    let _ = s.write_all(&reply);
                }
                let _ = served.send(());
            }
        });
        (port, Mutex::new((replies, done)))
    });
    let server = server
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    server.0.send(reply.to_vec()).unwrap();
    let port = *port;
    let url = HttpUrl::parse(&format!("http://127.0.0.1:{port}/disk.img")).unwrap();
    let opts = HttpOptions {
        timeout: Some(Duration::from_secs(2)),
        retries: 0,
        ..HttpOptions::default()
    };
    let client = Client::new(&url, &url, &opts).unwrap();
    let direct = direct::Direct::new(&client, &url).unwrap();
    let http = Http {
        direct: None,
        client,
        url: url.clone(),
        target: url,
        context: None,
        version: Version {
            len: 1 << 20,
            etag: ETag::parse("\"v1\""),
            last_modified: Some("Mon, 01 Jan 2024 00:00:00 GMT".into()),
        },
        head: Vec::new(),
        retries: 0,
        round_trip: Duration::ZERO,
    };
    let mut buf = vec![0xeeu8; 4096];
    let extra = [("Range", "bytes=4096-8191".to_string())];
    let check = |status: u16, h: Headers| http.check_reply(status, h, 4096, 8191);
    let read = direct.range(&extra, &mut buf, None, check);
    server.1.recv().unwrap();
    if let Ok(direct::Read::Done) = read {
        taken_as_said(reply, &buf);
    }
}

/// A range `buf` taken from `reply` must be bytes of it, given a length
/// of 4096 in digits, by a 206 reply.
fn taken_as_said(reply: &[u8], buf: &[u8]) {
    assert!(
        reply.windows(buf.len()).any(|w| w == buf),
        "a range taken that the reply does not hold"
    );
    // Taken only as the length the reply gave, in digits.
    let said = reply.split(|&b| b == b'\n').any(|line| {
        let line = line.to_ascii_lowercase();
        line.strip_prefix(b"content-length:")
            .is_some_and(|v| v.trim_ascii() == b"4096")
    });
    assert!(said, "a range taken without a Content-Length of 4096");
    // Taken only from a 206 reply, never from an interim (1xx) one read
    // past before it, whatever that one holds.
    let partial = reply
        .split(|&b| b == b'\n')
        .any(|line| line.starts_with(b"HTTP/1.") && line.get(8..13) == Some(b" 206 ".as_slice()));
    assert!(partial, "a range taken without a 206 reply");
}
