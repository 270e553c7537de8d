//! HTTP test servers: nginx (Debian's package, with a configuration of its
//! own in a scratch directory: plain or TLS, its access log read back to
//! see what it sent), Python's `http.server` (a server without range
//! support), and [`Hostile`], a small server that misbehaves on purpose.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The nginx binary: on PATH, or where Debian puts it (/usr/sbin, which
/// a user's PATH may lack).
pub fn nginx_binary() -> Option<PathBuf> {
    crate::tools::sbin_binary("nginx")
}

/// True if nginx is installed; else says the test is skipped.
pub fn have_nginx() -> bool {
    let found = nginx_binary().is_some();
    if !found {
        eprintln!("nginx missing: test skipped (scripts/setup.sh installs it)");
    }
    found
}

/// TLS for [`Nginx`]: a directory with server-cert.pem and server-key.pem
/// (as [`crate::nbd::make_pki`] lays out), and, to ask clients for a
/// certificate, the CA's certificate that must have signed it.
pub struct Tls<'a> {
    /// server-cert.pem and server-key.pem.
    pub server: &'a Path,
    /// ca-cert.pem clients' certificates must chain to (then required).
    pub client_ca: Option<&'a Path>,
}

/// One line of nginx's access log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// The reply's status.
    pub status: u16,
    /// Bytes of body sent.
    pub bytes: u64,
    /// The Range header, as `(first, last)`, if the request had one.
    pub range: Option<(u64, u64)>,
    /// The request's path and query.
    pub uri: String,
}

/// A running nginx, stopped when dropped.
pub struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:PORT` or `https://localhost:PORT` (no slash).
    pub url: String,
    /// The port.
    pub port: u16,
}

impl Nginx {
    /// Serve the files of `root` on a free port of 127.0.0.1, plain or
    /// with `tls`; `locations` is more configuration for the server block
    /// (`location /x { ... }`). One process (master_process off): it runs
    /// as the test's user and reads what the test made.
    pub fn start(root: &Path, tls: Option<Tls>, locations: &str) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("tmp")).unwrap();
        let port = crate::nbd::free_port();
        let ssl = match &tls {
            None => String::new(),
            Some(t) => {
                let mut s = format!(
                    "ssl_certificate {}/server-cert.pem;\n    ssl_certificate_key {}/server-key.pem;\n",
                    t.server.display(),
                    t.server.display()
                );
                if let Some(ca) = t.client_ca {
                    s += &format!(
                        "    ssl_client_certificate {}/ca-cert.pem;\n    ssl_verify_client on;\n",
                        ca.display()
                    );
                }
                s
            }
        };
        let conf = format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  log_format blk '$status $body_bytes_sent \"$http_range\" $request_uri';\n\
             access_log {d}/access.log blk;\n  client_body_temp_path {d}/tmp;\n\
             proxy_temp_path {d}/tmp;\n  fastcgi_temp_path {d}/tmp;\n  uwsgi_temp_path {d}/tmp;\n\
             scgi_temp_path {d}/tmp;\n  default_type application/octet-stream;\n\
             keepalive_requests 100000;\n  sendfile on;\n\
             server {{\n    listen 127.0.0.1:{port}{s};\n    {ssl}    root {root};\n    {locations}\n  }}\n}}\n",
            d = d.display(),
            s = if tls.is_some() { " ssl" } else { "" },
            root = root.display(),
        );
        std::fs::write(d.join("nginx.conf"), conf).unwrap();
        let nginx = nginx_binary().expect("nginx is installed (scripts/setup.sh)");
        let mut child = Command::new(nginx)
            .arg("-c")
            .arg(d.join("nginx.conf"))
            .arg("-p")
            .arg(d)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nginx runs");
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(s) = child.try_wait().unwrap() {
                let mut err = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut err);
                panic!("nginx exited ({s}): {err}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "nginx did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let url = match tls {
            Some(_) => format!("https://localhost:{port}"),
            None => format!("http://127.0.0.1:{port}"),
        };
        Nginx {
            child,
            dir,
            url,
            port,
        }
    }

    /// The access log so far, a line per request.
    pub fn log(&self) -> Vec<Logged> {
        let text = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        text.lines().map(parse_log_line).collect()
    }

    /// Forget what was logged so far.
    pub fn clear_log(&self) {
        let _ = std::fs::write(self.dir.path().join("access.log"), "");
    }

    /// Bytes of body sent for `uri` (every request for it).
    pub fn bytes_sent(&self, uri: &str) -> u64 {
        self.log()
            .iter()
            .filter(|l| l.uri == uri)
            .map(|l| l.bytes)
            .sum()
    }
}

fn parse_log_line(line: &str) -> Logged {
    // 206 65536 "bytes=0-65535" /a.qcow2
    let (status, rest) = line.split_once(' ').expect("status");
    let (bytes, rest) = rest.split_once(' ').expect("bytes");
    let rest = rest.strip_prefix('"').expect("range");
    let (range, uri) = rest.split_once("\" ").expect("uri");
    let range = range.strip_prefix("bytes=").and_then(|r| {
        let (a, b) = r.split_once('-')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    });
    Logged {
        status: status.parse().unwrap(),
        bytes: bytes.parse().unwrap(),
        range,
        uri: uri.to_string(),
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx `locations` (for [`Nginx::start`]) answering as a KubeVirt
/// VirtualMachineExport's server (virt-exportserver) does for a volume
/// PVC, whose files are `ROOT/volumes/PVC/disk.img` and `disk.img.gz`:
/// `/volumes/PVC/disk.img` as Go's `http.ServeContent` serves it (HEAD and
/// ranges; no ETag), `/volumes/PVC/disk.img.gz` as its gzip handler does
/// (GET only: HEAD and every other method answered 400; a Range ignored,
/// the whole stream sent, 200; nginx gives its length where the export
/// server streams it chunked), each only with `token` in the
/// `x-kubevirt-export-token` header or query parameter, else 401. `token`
/// is letters and digits.
pub fn kubevirt_export_locations(token: &str) -> String {
    assert!(token.chars().all(|c| c.is_ascii_alphanumeric()), "{token}");
    let check = format!(
        "set $ok 0;\n      if ($http_x_kubevirt_export_token = \"{token}\") {{ set $ok 1; }}\n      \
         if ($args ~ \"(^|&)x-kubevirt-export-token={token}(&|$)\") {{ set $ok 1; }}\n      \
         if ($ok = 0) {{ return 401; }}\n      etag off;\n"
    );
    format!(
        "location ~ ^/volumes/[^/]+/disk\\.img$ {{\n      {check}    }}\n    \
         location ~ ^/volumes/[^/]+/disk\\.img\\.gz$ {{\n      {check}      \
         if ($request_method != GET) {{ return 400; }}\n      max_ranges 0;\n    }}\n"
    )
}

/// `python3 -m http.server` serving `dir` on a free port of 127.0.0.1:
/// a server that ignores Range and sends every file whole (200).
pub struct PythonServer {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl PythonServer {
    /// Start it and wait until it answers.
    pub fn start(dir: &Path) -> PythonServer {
        let port = crate::nbd::free_port();
        let mut child = Command::new("python3")
            .args(["-m", "http.server", "--bind", "127.0.0.1"])
            .arg(port.to_string())
            .arg("--directory")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        crate::tools::wait_listening(&mut child, port, "http.server", String::new);
        PythonServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for PythonServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What [`Hostile`] does wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehave {
    /// Nothing: ranges served right, with an ETag and Last-Modified, and
    /// If-Match / If-Range honoured.
    Nothing,
    /// Range replies (after the first) without Content-Range.
    NoContentRange,
    /// Range replies (after the first) whose Content-Range is one byte off.
    WrongContentRange,
    /// Range replies (after the first) whose body stops halfway, the
    /// connection then closed.
    ShortBody,
    /// Range replies (after the first) with one byte more than asked for.
    LongBody,
    /// Range replies (after the first) without a length whose body never
    /// ends.
    EndlessBody,
    /// Range replies (after the first) one byte every 200 ms.
    Trickle,
    /// No answer at all to range requests (after the first).
    Silent,
    /// Every request redirected to itself.
    RedirectLoop,
    /// Every reply with 128 KiB of headers.
    HugeHeaders,
    /// Range requests after the first answered with this status.
    Status(u16),
    /// The file replaced by another version (other bytes, ETag,
    /// Last-Modified) after this many requests; conditions honoured, as a
    /// real server does (If-Match: 412; If-Range: the whole file).
    ChangesAfter(usize),
    /// As [`Misbehave::ChangesAfter`], conditions ignored: only the
    /// replies' validators tell.
    ChangesIgnoringConditions(usize),
    /// Every third connection closed as soon as it is accepted.
    DropEveryThird,
    /// Replies marked `Content-Encoding: gzip` (the bytes as they are).
    Gzip,
    /// Range replies (after the first) in chunks (`Transfer-Encoding:
    /// chunked`, no length): valid HTTP/1.1.
    Chunked,
    /// Range replies (after the first) with `Connection: close`, the
    /// connection then closed: valid HTTP/1.1.
    CloseEach,
    /// Range replies (after the first) with two Content-Lengths, the
    /// range's and one more.
    TwoLengths,
    /// Every reply (the first too) after an interim reply of this 1xx
    /// status (`103 Early Hints` with a `Link` header, `100 Continue`...),
    /// written just before it: valid HTTP/1.1 (RFC 9110, section 15.2).
    Interim(u16),
    /// Range replies (after the first): `103 Early Hints`, again and again,
    /// never the reply.
    EndlessInterim,
    /// Nothing wrong, but every reply held this many milliseconds, as
    /// across a network with that round trip.
    Delay(u64),
}

/// What a [`Hostile`] server saw.
#[derive(Default)]
pub struct Stats {
    /// Connections accepted.
    pub connections: AtomicUsize,
    /// Requests read.
    pub requests: AtomicUsize,
    /// The request heads, as received (for the tests of headers sent).
    pub heads: Mutex<Vec<String>>,
}

/// A TCP server on a free port of 127.0.0.1 whose connections a handler
/// serves, each on a thread of its own (detached: it ends when its client
/// goes, or, told by the flag, when the server stops); stopped when dropped.
struct Running {
    port: u16,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Running {
    fn start(handle: impl Fn(TcpStream, &AtomicBool) + Send + Sync + 'static) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let handle = Arc::new(handle);
        let accept = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (handle, stop) = (handle.clone(), stop.clone());
                    std::thread::spawn(move || handle(conn, &stop));
                }
            })
        };
        Running {
            port,
            stop,
            accept: Some(accept),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

/// A running hostile HTTP server on 127.0.0.1; stopped when dropped.
pub struct Hostile {
    /// `http://127.0.0.1:PORT/disk.img`.
    pub url: String,
    /// What it saw.
    pub stats: Arc<Stats>,
    _server: Running,
}

impl Hostile {
    /// Serve `data` at `/disk.img` (and any path), misbehaving as told.
    pub fn start(data: Vec<u8>, how: Misbehave) -> Hostile {
        let stats = Arc::new(Stats::default());
        let seen = stats.clone();
        let server = Running::start(move |conn, stop| {
            let n = seen.connections.fetch_add(1, Ordering::SeqCst) + 1;
            if how == Misbehave::DropEveryThird && n % 3 == 0 {
                return;
            }
            let _ = serve(conn, &data, how, &seen, stop);
        });
        Hostile {
            url: format!("http://127.0.0.1:{}/disk.img", server.port),
            stats,
            _server: server,
        }
    }
}

/// A request: its head's lines, lower-cased header names.
struct Request {
    head: String,
    range: Option<(u64, u64)>,
    if_match: Option<String>,
    if_range: Option<String>,
}

fn read_request(r: &mut BufReader<TcpStream>) -> io::Result<Option<Request>> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
        head += &line;
        if head.len() > 64 << 10 {
            return Err(io::Error::other("request head too long"));
        }
    }
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let range = header("range").and_then(|r| {
        let (a, b) = r.strip_prefix("bytes=")?.split_once('-')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    });
    Ok(Some(Request {
        range,
        if_match: header("if-match"),
        if_range: header("if-range"),
        head,
    }))
}

/// Write `b` a byte every 200 ms until the client goes or we stop.
fn trickle(s: &mut TcpStream, b: &[u8], stop: &AtomicBool) -> io::Result<()> {
    for byte in b {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        s.write_all(std::slice::from_ref(byte))?;
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// The two versions a changing file has: (bytes, ETag, Last-Modified).
fn version(data: &[u8], second: bool) -> (Vec<u8>, &'static str, &'static str) {
    if second {
        let mut d = data.to_vec();
        d.iter_mut().for_each(|b| *b ^= 0xa5);
        (d, "\"v2\"", "Tue, 02 Jan 2024 00:00:00 GMT")
    } else {
        (data.to_vec(), "\"v1\"", "Mon, 01 Jan 2024 00:00:00 GMT")
    }
}

fn serve(
    conn: TcpStream,
    data: &[u8],
    how: Misbehave,
    stats: &Stats,
    stop: &AtomicBool,
) -> io::Result<()> {
    let mut w = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    while let Some(req) = read_request(&mut r)? {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let n = stats.requests.fetch_add(1, Ordering::SeqCst) + 1;
        stats.heads.lock().unwrap().push(req.head.clone());
        if let Misbehave::Delay(ms) = how {
            std::thread::sleep(Duration::from_millis(ms));
        }
        if answer(&mut w, &req, data, how, n, stop)? == Answered::Closing {
            return Ok(());
        }
    }
    Ok(())
}

/// Whether the connection takes another request after an answer.
#[derive(PartialEq)]
enum Answered {
    Open,
    Closing,
}

/// An interim reply of status `code`, as servers send them before the
/// reply itself.
fn interim(code: u16) -> String {
    match code {
        100 => "HTTP/1.1 100 Continue\r\n\r\n".to_string(),
        103 => {
            "HTTP/1.1 103 Early Hints\r\nLink: </disk.img.sha256>; rel=preload\r\n\r\n".to_string()
        }
        c => format!("HTTP/1.1 {c} Interim\r\nX-Interim: yes\r\n\r\n"),
    }
}

/// Answer the `n`-th request `req` for `data` as `how` says.
fn answer(
    w: &mut TcpStream,
    req: &Request,
    data: &[u8],
    how: Misbehave,
    n: usize,
    stop: &AtomicBool,
) -> io::Result<Answered> {
    let second = match how {
        Misbehave::ChangesAfter(k) | Misbehave::ChangesIgnoringConditions(k) => n > k,
        _ => false,
    };
    let honour = !matches!(how, Misbehave::ChangesIgnoringConditions(_));
    let (bytes, etag, date) = version(data, second);
    if let Misbehave::Interim(code) = how {
        write!(w, "{}", interim(code))?;
    }
    if how == Misbehave::EndlessInterim && n > 1 {
        while !stop.load(Ordering::SeqCst) {
            w.write_all(interim(103).as_bytes())?;
            std::thread::sleep(Duration::from_millis(1));
        }
        return Ok(Answered::Closing);
    }
    let mut extra = format!("ETag: {etag}\r\nLast-Modified: {date}\r\n");
    if how == Misbehave::HugeHeaders {
        extra += &format!("X-Filler: {}\r\n", "x".repeat(128 << 10));
    }
    if how == Misbehave::Gzip {
        extra += "Content-Encoding: gzip\r\n";
    }
    if how == Misbehave::RedirectLoop {
        let path = req.head.split(' ').nth(1).unwrap_or("/").to_string();
        write!(
            w,
            "HTTP/1.1 302 Found\r\nLocation: {path}\r\nContent-Length: 0\r\n\r\n"
        )?;
        return Ok(Answered::Open);
    }
    let stale = |cond: &Option<String>, by: &str| honour && cond.as_ref().is_some_and(|c| c != by);
    if stale(&req.if_match, etag) {
        write!(
            w,
            "HTTP/1.1 412 Precondition Failed\r\n{extra}Content-Length: 0\r\n\r\n"
        )?;
        return Ok(Answered::Open);
    }
    let whole = req.range.is_none() || stale(&req.if_range, date);
    let Some((a, b)) = req.range.filter(|_| !whole) else {
        write!(
            w,
            "HTTP/1.1 200 OK\r\n{extra}Content-Length: {}\r\n\r\n",
            bytes.len()
        )?;
        w.write_all(&bytes)?;
        return Ok(Answered::Open);
    };
    let len = bytes.len() as u64;
    if a >= len {
        write!(
            w,
            "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\n\r\n"
        )?;
        return Ok(Answered::Open);
    }
    let b = b.min(len - 1);
    let part = Part {
        body: &bytes[a as usize..=b as usize],
        first: a,
        last: b,
        len,
        extra: &extra,
    };
    // Range replies misbehave after the first (as `Misbehave` says).
    let how = if n == 1 { Misbehave::Nothing } else { how };
    send_range(w, &part, how, stop)
}

/// A range of the file to send: `body`, bytes `first..=last` of `len`,
/// with the `extra` headers.
struct Part<'a> {
    body: &'a [u8],
    first: u64,
    last: u64,
    len: u64,
    extra: &'a str,
}

/// Send `part` as a 206 answer, misbehaving as `how` says.
fn send_range(
    w: &mut TcpStream,
    part: &Part,
    how: Misbehave,
    stop: &AtomicBool,
) -> io::Result<Answered> {
    let Part {
        body,
        first: a,
        last: b,
        len,
        extra,
    } = *part;
    let range = format!("Content-Range: bytes {a}-{b}/{len}\r\n");
    let head = |range: &str, length: Option<usize>| {
        let length = length.map_or(String::new(), |n| format!("Content-Length: {n}\r\n"));
        format!("HTTP/1.1 206 Partial Content\r\n{extra}{range}{length}\r\n")
    };
    if let Some(answered) = stall(w, how, &|n| head(&range, n), body, stop)? {
        return Ok(answered);
    }
    match how {
        Misbehave::NoContentRange => {
            w.write_all(head("", Some(body.len())).as_bytes())?;
            w.write_all(body)?;
        }
        Misbehave::WrongContentRange => {
            let off = format!("Content-Range: bytes {}-{}/{len}\r\n", a + 1, b + 1);
            w.write_all(head(&off, Some(body.len())).as_bytes())?;
            w.write_all(body)?;
        }
        Misbehave::ShortBody => {
            w.write_all(head(&range, Some(body.len())).as_bytes())?;
            w.write_all(&body[..body.len() / 2])?;
            return Ok(Answered::Closing);
        }
        Misbehave::LongBody => {
            w.write_all(head(&range, Some(body.len() + 1)).as_bytes())?;
            w.write_all(body)?;
            w.write_all(b"!")?;
        }
        Misbehave::Chunked => {
            w.write_all(
                head(&range, None)
                    .replace("\r\n\r\n", "\r\nTransfer-Encoding: chunked\r\n\r\n")
                    .as_bytes(),
            )?;
            for chunk in body.chunks(5000) {
                write!(w, "{:x}\r\n", chunk.len())?;
                w.write_all(chunk)?;
                w.write_all(b"\r\n")?;
            }
            w.write_all(b"0\r\n\r\n")?;
        }
        Misbehave::CloseEach => {
            let range = format!("{range}Connection: close\r\n");
            w.write_all(head(&range, Some(body.len())).as_bytes())?;
            w.write_all(body)?;
            return Ok(Answered::Closing);
        }
        Misbehave::TwoLengths => {
            let second = format!("\r\nContent-Length: {}\r\n\r\n", body.len() + 1);
            let head = head(&range, Some(body.len())).replace("\r\n\r\n", &second);
            w.write_all(head.as_bytes())?;
            w.write_all(body)?;
        }
        _ => {
            w.write_all(head(&range, Some(body.len())).as_bytes())?;
            w.write_all(body)?;
        }
    }
    Ok(Answered::Open)
}

/// The answers to a range request that stall or refuse it: sent, and how
/// the connection is left; `None` for the others. `head` gives the reply's
/// head with its Content-Length, if any.
fn stall(
    w: &mut TcpStream,
    how: Misbehave,
    head: &dyn Fn(Option<usize>) -> String,
    body: &[u8],
    stop: &AtomicBool,
) -> io::Result<Option<Answered>> {
    match how {
        Misbehave::EndlessBody => {
            w.write_all(head(None).as_bytes())?;
            let chunk = vec![0x5au8; 64 << 10];
            while !stop.load(Ordering::SeqCst) {
                w.write_all(&chunk)?;
            }
        }
        Misbehave::Trickle => {
            w.write_all(head(Some(body.len())).as_bytes())?;
            trickle(w, body, stop)?;
        }
        Misbehave::Silent => {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Misbehave::Status(code) => {
            write!(w, "HTTP/1.1 {code} Hostile\r\nContent-Length: 0\r\n\r\n")?;
            return Ok(Some(Answered::Open));
        }
        _ => return Ok(None),
    }
    Ok(Some(Answered::Closing))
}

/// An HTTP CONNECT proxy on 127.0.0.1 (what ureq speaks to a proxy, for
/// http and https URLs alike): it counts the tunnels it made, then relays
/// bytes both ways; stopped when dropped.
pub struct ConnectProxy {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Tunnels made (CONNECT requests answered 200).
    pub tunnels: Arc<AtomicUsize>,
    _server: Running,
}

impl ConnectProxy {
    /// Start it.
    pub fn start() -> ConnectProxy {
        let tunnels = Arc::new(AtomicUsize::new(0));
        let made = tunnels.clone();
        let server = Running::start(move |conn, _| {
            let _ = tunnel(conn, &made);
        });
        ConnectProxy {
            url: format!("http://127.0.0.1:{}", server.port),
            tunnels,
            _server: server,
        }
    }

    /// Tunnels made so far.
    pub fn count(&self) -> usize {
        self.tunnels.load(Ordering::SeqCst)
    }
}

/// One CONNECT to a 127.0.0.1 port (the tests' servers; any other target
/// is refused), then the bytes relayed until either side closes.
fn tunnel(conn: TcpStream, tunnels: &AtomicUsize) -> io::Result<()> {
    let mut w = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    let Some(req) = read_request(&mut r)? else {
        return Ok(());
    };
    let target = req
        .head
        .strip_prefix("CONNECT ")
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.strip_prefix("127.0.0.1:"))
        .and_then(|p| p.parse::<u16>().ok());
    let Some(port) = target else {
        return w.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n");
    };
    let server = TcpStream::connect(("127.0.0.1", port))?;
    tunnels.fetch_add(1, Ordering::SeqCst);
    w.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    let (mut to_server, mut from_server) = (server.try_clone()?, server);
    // What the client sent after its CONNECT is in the reader's buffer.
    to_server.write_all(r.buffer())?;
    let mut client = r.into_inner();
    let up = std::thread::spawn(move || {
        let _ = io::copy(&mut client, &mut to_server);
        let _ = to_server.shutdown(std::net::Shutdown::Write);
    });
    let _ = io::copy(&mut from_server, &mut w);
    let _ = w.shutdown(std::net::Shutdown::Both);
    let _ = up.join();
    Ok(())
}
