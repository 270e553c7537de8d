//! TLS over NBD (after NBD_OPT_STARTTLS), with rustls and its ring provider.
//!
//! Certificates are read from a directory laid out as libnbd, QEMU and
//! nbdkit (gnutls) expect: `ca-cert.pem`, the certificate authorities the
//! server's certificate must chain to, and optionally `client-cert.pem` with
//! `client-key.pem`, a certificate to authenticate the client. Without a
//! directory the system's CAs are trusted (rustls-native-certs: the same
//! store as OpenSSL's, /etc/ssl/certs on Debian, with SSL_CERT_FILE and
//! SSL_CERT_DIR honoured, so an administrator's own CA added there works;
//! a compiled-in list such as webpki-roots would miss it, and NBD servers
//! rarely have a certificate from a public CA).
//!
//! # Transmission: one session shared by a reader thread and the writers
//!
//! A [`Connection`](super::connection::Connection) reads replies on a reader
//! thread while callers write requests. A rustls session cannot be split in
//! two halves (reading records may need writes: alerts, key updates; both
//! directions share its state), so both halves share one session under a
//! mutex, and the socket is put in non-blocking mode: each side holds the
//! lock only for what can be done without waiting (decrypting records that
//! have arrived, encrypting and sending a request), and waits in `poll(2)`
//! with the lock released. So requests go out while the reader waits for
//! replies, and many requests are in flight, as on a plain connection. One
//! I/O thread owning the session would work too, but would add a thread,
//! a queue and a wake-up channel per connection, and a hop for every
//! request. Plain connections don't use any of this: they keep their two
//! socket halves and read payloads straight into the caller's buffer.

use super::transport::{Socket, Split};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use std::io::{self, BufRead, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// The CA certificates file in a certificates directory.
pub const CA_CERT: &str = "ca-cert.pem";
/// The client certificate (chain) file, optional.
pub const CLIENT_CERT: &str = "client-cert.pem";
/// The client certificate's private key, with [`CLIENT_CERT`].
pub const CLIENT_KEY: &str = "client-key.pem";

/// A TLS session during the option haggling (blocking reads and writes).
pub struct Tls {
    conn: ClientConnection,
    sock: Socket,
    timeout: Option<Duration>,
    /// A client certificate was offered.
    client_cert: bool,
}

impl Tls {
    /// Explain an error in the option haggling that follows the handshake.
    pub fn after_handshake(&self, e: io::Error) -> io::Error {
        no_client_cert_hint(e, self.client_cert)
    }
}

/// In TLS 1.3 a server checks the client's certificate at the end of the
/// handshake, and gnutls (qemu-nbd, nbdkit) then just hangs up: say what
/// is likely missing.
fn no_client_cert_hint(e: io::Error, client_cert: bool) -> io::Error {
    if client_cert
        || !matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe
        )
    {
        return e;
    }
    io::Error::new(
        e.kind(),
        format!(
            "the server hung up after the TLS handshake: does it want a client \
             certificate ({CLIENT_CERT} and {CLIENT_KEY} in the certificates directory)?"
        ),
    )
}

impl super::handshake::SetReadTimeout for Tls {
    fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.sock.set_read_timeout(t)
    }
}

impl Read for Tls {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        rustls::Stream::new(&mut self.conn, &mut self.sock)
            .read(buf)
            .map_err(|e| explain(e, self.timeout))
    }
}

impl Write for Tls {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        rustls::Stream::new(&mut self.conn, &mut self.sock)
            .write(buf)
            .map_err(|e| explain(e, self.timeout))
    }
    fn flush(&mut self) -> io::Result<()> {
        rustls::Stream::new(&mut self.conn, &mut self.sock)
            .flush()
            .map_err(|e| explain(e, self.timeout))
    }
}

fn file_error(path: &Path, e: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("TLS certificates: {}: {e}", path.display()),
    )
}

fn read_file(path: &Path) -> io::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("TLS certificates: cannot read {}: {e}", path.display()),
        )
    })
}

/// Every certificate in the PEM file `path` (at least one).
fn read_certs(path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let pem = read_file(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no PEM certificate in it"));
    }
    Ok(certs)
}

/// A client certificate chain and its key (DER, and the key's file as
/// it is: PEM).
type ClientCert = (
    Vec<CertificateDer<'static>>,
    PrivateKeyDer<'static>,
    Vec<u8>,
);

/// The certificate authorities and the client certificate, if any, in a
/// certificates directory laid out as QEMU's (`ca-cert.pem`...).
fn load_dir(dir: &Path) -> io::Result<(Vec<CertificateDer<'static>>, Option<ClientCert>)> {
    let ca = read_certs(&dir.join(CA_CERT))?;
    let cert = dir.join(CLIENT_CERT);
    let key = dir.join(CLIENT_KEY);
    match (cert.exists(), key.exists()) {
        (false, false) => Ok((ca, None)),
        (true, true) => {
            let chain = read_certs(&cert)?;
            let pem = read_file(&key)?;
            let key_der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| file_error(&key, e))?;
            Ok((ca, Some((chain, key_der, pem))))
        }
        (has_cert, _) => {
            let (there, missing): (&PathBuf, &PathBuf) = if has_cert {
                (&cert, &key)
            } else {
                (&key, &cert)
            };
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "TLS certificates: {} without {}",
                    there.display(),
                    missing.display()
                ),
            ))
        }
    }
}

/// Every certificate of the PEM files in `dir`, a directory of CA
/// certificates as curl's `--capath` and OpenSSL's `c_rehash` take it
/// (`/etc/ssl/certs`): files without a PEM certificate are skipped, and a
/// hash link (c_rehash makes them) only repeats a root.
/// No crate reads such a directory: rustls-native-certs reads only the
/// system's, from SSL_CERT_DIR.
fn load_capath(dir: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("TLS certificates: cannot read {}: {e}", dir.display()),
            )
        })?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .collect();
    names.sort();
    let mut certs = Vec::new();
    for name in names {
        // Followed links (c_rehash makes them); a CA file is small: a
        // file larger than CAPATH_FILE_MAX is not one.
        let is_pem =
            std::fs::metadata(&name).is_ok_and(|m| m.is_file() && m.len() <= CAPATH_FILE_MAX);
        if !is_pem {
            continue;
        }
        let pem = read_file(&name)?;
        // What a trust store takes: another certificate in the directory
        // (a server's, say) does not make the whole directory unusable.
        certs.extend(
            CertificateDer::pem_slice_iter(&pem)
                .filter_map(Result::ok)
                .filter(|c| RootCertStore::empty().add(c.clone()).is_ok()),
        );
    }
    if certs.is_empty() {
        return Err(file_error(
            dir,
            format!("no {CA_CERT} and no PEM certificate in this directory"),
        ));
    }
    Ok(certs)
}

/// The largest file of a CA directory read (the system's whole bundle is
/// about 200 KiB).
const CAPATH_FILE_MAX: u64 = 16 << 20;

/// No certificates directory named and no system CA certificates found
/// (the `io::Error`'s inner error, [`io::ErrorKind::NotFound`]): a program
/// recognizes it to say how its user names a directory with `ca-cert.pem`
/// (the URL's `tls-certificates=DIR`, or an option of its own).
#[derive(Debug)]
pub struct NoCaCertificates {
    /// Why the system's certificates could not be loaded, if it says.
    why: Option<String>,
}

impl std::fmt::Display for NoCaCertificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TLS: no system CA certificates found")?;
        if let Some(why) = &self.why {
            write!(f, " ({why})")?;
        }
        write!(
            f,
            ": name the CAs to trust (a PEM file, or a directory with {CA_CERT})"
        )
    }
}

impl std::error::Error for NoCaCertificates {}

/// The server's certificate chains to no certificate authority trusted
/// (a private CA, most often): a program recognizes it to say how its user
/// names the CA's certificate (an option of its own; the library names
/// only `SSL_CERT_FILE`, which every program honours).
#[derive(Debug)]
pub struct UnknownIssuer {
    reason: String,
}

impl std::fmt::Display for UnknownIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TLS: certificate verify failed: {}: the server's certificate authority is not \
             trusted: name its certificate (a PEM file, or a directory of them), or set \
             SSL_CERT_FILE=FILE",
            self.reason
        )
    }
}

impl std::error::Error for UnknownIssuer {}

/// What a TLS client trusts and shows: the certificate authorities (a
/// directory's `ca-cert.pem`, or the system's), and the client certificate
/// with its key, if the directory has one. The NBD client and the HTTPS
/// client load it alike.
pub(crate) struct Trust {
    /// The certificate authorities the server's certificate must chain to.
    pub roots: Vec<CertificateDer<'static>>,
    /// The client certificate chain and its key.
    pub client: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    /// The key's file as it is (PEM), for a client that takes PEM.
    pub key_pem: Option<Vec<u8>>,
}

/// What `path` names, checked: a PEM file of CA certificates (curl's
/// `--cacert`), a directory laid out as QEMU's (`ca-cert.pem`, with
/// `client-cert.pem` and `client-key.pem` for a client certificate), or
/// a directory of CA certificates (curl's `--capath`); `None`: the
/// system's CAs. A client certificate that does not go with its key is
/// an error here.
pub(crate) fn trust(path: Option<&Path>) -> io::Result<Trust> {
    let (roots, client) = match path {
        Some(dir) if dir.join(CA_CERT).exists() => load_dir(dir)?,
        Some(dir) if dir.is_dir() => (load_capath(dir)?, None),
        Some(missing) if !missing.exists() => {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "TLS certificates: {}: no such file or directory (a PEM file of CA \
                     certificates, or a directory with {CA_CERT} or of CA certificates)",
                    missing.display()
                ),
            ));
        }
        Some(file) => (read_certs(file)?, None),
        None => {
            let found = rustls_native_certs::load_native_certs();
            let mut store = RootCertStore::empty();
            let (added, _) = store.add_parsable_certificates(found.certs.iter().cloned());
            if added == 0 {
                let why = found.errors.first().map(|e| e.to_string());
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    NoCaCertificates { why },
                ));
            }
            (found.certs, None)
        }
    };
    if let Some(p) = path {
        let mut store = RootCertStore::empty();
        for c in &roots {
            store.add(c.clone()).map_err(|e| file_error(p, e))?;
        }
    }
    let (client, key_pem) = match client {
        Some((chain, key, pem)) => (Some((chain, key)), Some(pem)),
        None => (None, None),
    };
    let trust = Trust {
        roots,
        client,
        key_pem,
    };
    trust.client_config()?;
    Ok(trust)
}

impl Trust {
    /// The rustls client configuration (ring's cryptography).
    fn client_config(&self) -> io::Result<ClientConfig> {
        let mut store = RootCertStore::empty();
        store.add_parsable_certificates(self.roots.iter().cloned());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| io::Error::other(format!("TLS: {e}")))?
            .with_root_certificates(store);
        match &self.client {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("TLS: client certificate {CLIENT_CERT} and {CLIENT_KEY}: {e}"),
                    )
                }),
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

/// The client configuration for the certificates in `dir` (or the
/// system's CAs).
pub fn config(dir: Option<&Path>) -> io::Result<ClientConfig> {
    trust(dir)?.client_config()
}

/// Put a rustls failure (wrapped in an I/O error by rustls) in words:
/// certificate problems say "certificate verify failed".
fn explain(e: io::Error, timeout: Option<Duration>) -> io::Error {
    if matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ) {
        return timed_out(timeout);
    }
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(t) => tls_error(t),
        None => e,
    }
}

pub(crate) fn tls_error(t: &rustls::Error) -> io::Error {
    use rustls::{AlertDescription as A, CertificateError, Error};
    let msg = match t {
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            return io::Error::new(
                io::ErrorKind::InvalidData,
                UnknownIssuer {
                    reason: t.to_string(),
                },
            );
        }
        Error::InvalidCertificate(_) => format!("TLS: certificate verify failed: {t}"),
        Error::AlertReceived(
            A::BadCertificate
            | A::CertificateRequired
            | A::UnknownCA
            | A::CertificateUnknown
            | A::AccessDenied,
        ) => format!(
            "TLS: the server rejected the client ({t}): does it want a client \
             certificate ({CLIENT_CERT} and {CLIENT_KEY})?"
        ),
        _ => format!("TLS: {t}"),
    };
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn timed_out(timeout: Option<Duration>) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "TLS: the server did not answer for {} seconds",
            timeout.unwrap_or_default().as_secs_f64()
        ),
    )
}

/// The TLS handshake on `sock` (NBD_OPT_STARTTLS acknowledged), checking
/// the server's certificate for `server_name` (a host name or IP address).
pub fn connect(
    mut sock: Socket,
    server_name: &str,
    config: &Arc<ClientConfig>,
    timeout: Option<Duration>,
) -> io::Result<Tls> {
    let config = config.clone();
    let client_cert = config.client_auth_cert_resolver.has_certs();
    let name = ServerName::try_from(server_name.to_string()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("TLS: invalid server name '{server_name}'"),
        )
    })?;
    let mut conn = ClientConnection::new(config, name).map_err(|e| tls_error(&e))?;
    // One deadline for the whole TLS handshake, not per read: a server
    // trickling bytes must not hold us.
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    let handshake_timed_out = || {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "timed out after {} s in the TLS handshake",
                timeout.unwrap_or_default().as_secs_f64()
            ),
        )
    };
    while conn.is_handshaking() {
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(handshake_timed_out());
            }
            super::handshake::SetReadTimeout::set_read_timeout(&mut sock, Some(left))?;
        }
        conn.complete_io(&mut sock).map_err(|e| {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                handshake_timed_out()
            } else {
                no_client_cert_hint(explain(e, timeout), client_cert)
            }
        })?;
    }
    Ok(Tls {
        conn,
        sock,
        timeout,
        client_cert,
    })
}

/// Bytes read from the socket per system call: rustls takes 4 KiB at a
/// time, which would cost 4 reads per 16 KiB record.
const RAW_BUFFER: usize = 256 << 10;
/// Plaintext buffered for reply headers; payloads bypass it.
const READ_BUFFER: usize = 64 << 10;

/// Encrypted bytes read from the socket, not yet given to rustls.
struct Raw {
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
}

/// What rustls reads from: `raw`, refilled by one socket read when empty.
struct Feed<'a> {
    sock: &'a mut Socket,
    raw: &'a mut Raw,
}

impl Read for Feed<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let r = &mut *self.raw;
        if r.pos == r.end {
            let n = self.sock.read(&mut r.buf)?;
            r.pos = 0;
            r.end = n;
        }
        let n = out.len().min(r.end - r.pos);
        out[..n].copy_from_slice(&r.buf[r.pos..r.pos + n]);
        r.pos += n;
        Ok(n)
    }
}

struct State {
    conn: ClientConnection,
    sock: Socket,
    raw: Raw,
}

/// The session shared by the reader and the writers (see the module doc).
struct Session {
    state: Mutex<State>,
    /// The socket's descriptor, to poll without the lock.
    fd: RawFd,
    timeout: Option<Duration>,
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl Session {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait until the socket is ready for `events` (or hung up). A timeout
    /// is an error of kind TimedOut, as a plain socket's read timeout is.
    fn wait(&self, events: libc::c_short) -> io::Result<()> {
        let mut p = libc::pollfd {
            fd: self.fd,
            events,
            revents: 0,
        };
        let ms = match self.timeout {
            Some(t) => t.as_millis().clamp(1, i32::MAX as u128) as i32,
            None => -1,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        if r == 0 {
            return Err(timed_out(self.timeout));
        }
        Ok(())
    }

    /// Send what rustls has encrypted, as far as the socket takes it now:
    /// Ok(true) once everything is sent.
    fn push(st: &mut State) -> io::Result<bool> {
        while st.conn.wants_write() {
            match st.conn.write_tls(&mut st.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if would_block(&e) => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Send everything rustls has encrypted, waiting for the socket.
    fn flush(&self) -> io::Result<()> {
        loop {
            if Self::push(&mut self.lock())? {
                return Ok(());
            }
            self.wait(libc::POLLOUT)?;
        }
    }

    /// Decrypted bytes into `out` (not empty): Ok(0) at the end of the
    /// stream, with or without the server's close_notify (the NBD layer
    /// then reports a closed connection).
    fn read_plain(&self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            {
                let mut g = self.lock();
                let st = &mut *g;
                loop {
                    match st.conn.reader().read(out) {
                        Ok(n) => return Ok(n),
                        Err(e) if would_block(&e) => {}
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                        Err(e) => return Err(e),
                    }
                    let feed = &mut Feed {
                        sock: &mut st.sock,
                        raw: &mut st.raw,
                    };
                    match st.conn.read_tls(feed) {
                        // Ok(0) is the end: rustls's reader says so above.
                        Ok(_) => {}
                        Err(e) if would_block(&e) => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    }
                    if let Err(e) = st.conn.process_new_packets() {
                        // Tell the server why (an alert), as rustls's own
                        // blocking helpers do.
                        let _ = Self::push(st);
                        return Err(tls_error(&e));
                    }
                    // Records may want an answer (a key update): send it
                    // if the socket takes it now, else the next request does.
                    Self::push(st)?;
                }
            }
            self.wait(libc::POLLIN)?;
        }
    }

    /// Say goodbye (best effort: the socket is shut down next).
    fn close_notify(&self) {
        let mut st = self.lock();
        st.conn.send_close_notify();
        let _ = Self::push(&mut st);
    }
}

/// The reading half: plaintext, buffered for headers.
struct TlsReader {
    session: Arc<Session>,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
}

impl Read for TlsReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        // Large reads (payloads) skip the buffer: one copy fewer.
        if self.pos == self.end && out.len() >= self.buf.len() / 4 {
            return self.session.read_plain(out);
        }
        let avail = self.fill_buf()?;
        let n = avail.len().min(out.len());
        out[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for TlsReader {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.pos == self.end {
            self.end = self.session.read_plain(&mut self.buf)?;
            self.pos = 0;
        }
        Ok(&self.buf[self.pos..self.end])
    }
    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.end);
    }
}

/// The writing half: each write is encrypted and sent at once.
struct TlsWriter(Arc<Session>);

impl Write for TlsWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            let n = self.0.lock().conn.writer().write(buf)?;
            self.0.flush()?;
            // 0: rustls's send buffer was full; it is empty now.
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// Split a session for the transmission phase (see the module doc).
pub fn split(t: Tls) -> io::Result<Split> {
    let Tls {
        conn,
        sock,
        timeout,
        ..
    } = t;
    sock.set_nonblocking(true)?;
    let control = sock.try_clone()?;
    let session = Arc::new(Session {
        fd: sock.as_raw_fd(),
        state: Mutex::new(State {
            conn,
            sock,
            raw: Raw {
                buf: vec![0; RAW_BUFFER].into_boxed_slice(),
                pos: 0,
                end: 0,
            },
        }),
        timeout,
    });
    let closing = session.clone();
    Ok(Split {
        reader: Box::new(TlsReader {
            session: session.clone(),
            buf: vec![0; READ_BUFFER].into_boxed_slice(),
            pos: 0,
            end: 0,
        }),
        writer: Box::new(TlsWriter(session)),
        shutdown: Arc::new(move || {
            closing.close_notify();
            control.shutdown();
        }),
    })
}
