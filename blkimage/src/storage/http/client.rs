//! One HTTP(S) client per remote file: ureq's agent (HTTP/1.1, a pool of
//! keep-alive connections, one per reading thread) set up as the user
//! asked (TLS certificates, headers, timeout, a proxy from the
//! environment), and the failures of a request sorted into those worth
//! another try and those that end the run.

use super::HttpOptions;
use super::interim::SkipInterim;
use super::url::HttpUrl;
use base64::Engine;
use std::io::{self, Read};
use std::time::{Duration, Instant};
use ureq::http::Response;
use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};
use ureq::unversioned::resolver::DefaultResolver;
use ureq::unversioned::transport::{Connector, DefaultConnector};
use ureq::{Body, Proxy};

/// Why a request failed: worth another try (a reset connection, a
/// timeout, 502/503/504...), or not (a refusal, another version, a
/// malformed reply).
#[derive(Debug)]
pub(crate) enum Fail {
    /// Transient: the same request may succeed.
    Again(io::Error),
    /// Final: the run stops with this error.
    Final(io::Error),
}

impl Fail {
    /// The error, transient or not.
    pub(crate) fn into_error(self) -> io::Error {
        match self {
            Fail::Again(e) | Fail::Final(e) => e,
        }
    }

    pub(crate) fn final_with(kind: io::ErrorKind, msg: String) -> Fail {
        Fail::Final(io::Error::new(kind, msg))
    }
}

/// Who asks, in every request.
pub(crate) const USER_AGENT: &str = concat!("blkhash/", env!("CARGO_PKG_VERSION"));

/// Idle connections kept per host: more than the reads in flight
/// (`DEFAULT_IO_DEPTH`, or what --io-depth asks, up to 256 reads), so that
/// each reading thread keeps its connection alive between requests.
const POOL: usize = 256;

/// A client for one file's URL and the URLs it redirects to.
pub(crate) struct Client {
    agent: ureq::Agent,
    /// Where the user's headers and credentials go: the URL's own origin
    /// (a redirect to another host gets neither, as curl does without
    /// --location-trusted: a token for a registry must not reach the
    /// object store it redirects to).
    origin: url::Origin,
    auth: Option<String>,
    headers: Vec<(String, String)>,
    timeout: Option<Duration>,
    /// The proxy requests go through, in words (its URL without a
    /// password, and the variable that named it), for errors.
    proxy: Option<String>,
}

impl Client {
    /// A client for the file the user named `given`, set up (proxy, TLS)
    /// for requests to `url` (`given` or where it redirects).
    pub(crate) fn new(given: &HttpUrl, url: &HttpUrl, opts: &HttpOptions) -> io::Result<Client> {
        let proxy = proxy_for(url)?;
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            // Redirects are followed by hand (super::open): counted, https
            // to http refused, and the target kept for every range.
            .max_redirects(0)
            .max_redirects_will_error(false)
            .user_agent(USER_AGENT)
            // The bytes as stored: a compressed reply would be hashed as
            // data (ureq has no decoder without its gzip feature anyway).
            .accept_encoding("identity")
            .max_idle_connections(POOL)
            .max_idle_connections_per_host(POOL)
            // Buffers per connection (ureq's defaults are 128 KiB each, 16
            // MiB for 64 connections): a request is a few hundred bytes,
            // and the input buffer need only hold the largest reply head
            // allowed (64 KiB, ureq's default) with room to spare.
            .output_buffer_size(16 << 10)
            .input_buffer_size(80 << 10)
            .proxy(proxy.as_ref().map(|p| p.proxy.clone()))
            .timeout_connect(opts.timeout)
            .timeout_recv_response(opts.timeout)
            .timeout_per_read(opts.timeout);
        // TLS settings for an https URL, or for an https proxy (whatever the
        // URL: ureq's defaults for one, without a crypto provider or roots
        // of its own here, would panic).
        let https_proxy = proxy
            .as_ref()
            .is_some_and(|p| p.proxy.protocol() == ureq::ProxyProtocol::Https);
        if url.is_https() || https_proxy {
            config = config.tls_config(tls_config(opts)?);
        }
        // The rules the front ends parse headers by, for every caller: a
        // header is written into requests as it is (see direct.rs).
        for (name, value) in &opts.headers {
            super::check_header(name, value)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        }
        // Credentials from one place only: both would send two
        // Authorization headers, which servers take as they please.
        if given.credentials().is_some()
            && opts
                .headers
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case("authorization"))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the URL's user:password and an Authorization header both give \
                 credentials: keep one",
            ));
        }
        let auth = given.credentials().map(|(user, password)| {
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            format!("Basic {token}")
        });
        // ureq's connections, with a last layer that reads past interim
        // (1xx) replies as direct.rs does (see interim.rs).
        let connector = DefaultConnector::new().chain(SkipInterim);
        let agent = ureq::Agent::with_parts(config.build(), connector, DefaultResolver::default());
        Ok(Client {
            agent,
            origin: given.origin(),
            auth,
            headers: opts.headers.clone(),
            timeout: opts.timeout,
            proxy: proxy.map(|p| p.shown),
        })
    }

    /// The user's headers and credentials, for requests to `url`: none
    /// unless it is the client's origin.
    pub(crate) fn users_headers(&self, url: &HttpUrl) -> Vec<(&str, &str)> {
        if url.origin() != self.origin {
            return vec![];
        }
        let auth = self.auth.as_deref().map(|a| ("Authorization", a));
        self.headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .chain(auth)
            .collect()
    }

    /// True if requests go through a proxy.
    pub(crate) fn proxied(&self) -> bool {
        self.proxy.is_some()
    }

    /// The timeout asked for, if any.
    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// GET `url` with the extra headers `extra` (a range, a condition);
    /// the user's headers and credentials only to the client's origin.
    pub(crate) fn get(
        &self,
        url: &HttpUrl,
        extra: &[(&str, String)],
    ) -> Result<Response<Body>, Fail> {
        let mut req = self.agent.get(url.request_url());
        for (name, value) in self.users_headers(url) {
            req = req.header(name, value);
        }
        for (name, value) in extra {
            req = req.header(*name, value);
        }
        req.call()
            .map_err(|e| match (classify(e, self.timeout), &self.proxy) {
                // A connection that cannot be made: say where to, the proxy
                // if there is one (the only host connected to then).
                (Fail::Final(e) | Fail::Again(e), proxy)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                    ) =>
                {
                    let to = match proxy {
                        Some(p) => p.clone(),
                        None => url.authority().to_string(),
                    };
                    cannot_connect(&to, e)
                }
                // Whatever else failed before a reply (a SOCKS proxy's refusal
                // to reach the server, a timeout...) went through the proxy.
                (f, Some(p)) => {
                    let within =
                        |e: io::Error| io::Error::new(e.kind(), format!("through {p}: {e}"));
                    match f {
                        Fail::Again(e) => Fail::Again(within(e)),
                        Fail::Final(e) => Fail::Final(within(e)),
                    }
                }
                (f, None) => f,
            })
    }
}

/// A connection to `to` that could not be made.
pub(crate) fn cannot_connect(to: &str, e: io::Error) -> Fail {
    Fail::Final(io::Error::new(
        e.kind(),
        format!("cannot connect to {to}: {e}"),
    ))
}

/// ureq's TLS settings for `opts`: the roots and client certificate as
/// for `nbds://` (the certificates directory, else the system's CAs),
/// checked by rustls first (ureq takes an invalid key for a bug).
fn tls_config(opts: &HttpOptions) -> io::Result<TlsConfig> {
    let trust = crate::storage::nbd::tls::trust(opts.tls_certificates.as_deref())?;
    let roots: Vec<Certificate<'static>> = trust
        .roots
        .iter()
        .map(|c| Certificate::from_der(c.as_ref()).to_owned())
        .collect();
    let client = match (&trust.client, &trust.key_pem) {
        (Some((chain, _)), Some(pem)) => {
            let chain: Vec<Certificate<'static>> = chain
                .iter()
                .map(|c| Certificate::from_der(c.as_ref()).to_owned())
                .collect();
            let key = PrivateKey::from_pem(pem).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("TLS certificates: the client key: {e}"),
                )
            })?;
            Some(ClientCert::new_with_certs(&chain, key))
        }
        _ => None,
    };
    Ok(TlsConfig::builder()
        .root_certs(RootCerts::new_with_certs(&roots))
        .client_cert(client)
        .unversioned_rustls_crypto_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .build())
}

/// The first of the environment variables `names` set and not empty
/// (lower case first, as curl reads them): its name and value.
fn env<'a>(names: &[&'a str]) -> Option<(&'a str, String)> {
    names.iter().find_map(|n| {
        std::env::var(n)
            .ok()
            .filter(|v| !v.is_empty())
            .map(|v| (*n, v))
    })
}

/// A proxy from the environment, and how errors name it.
struct EnvProxy {
    proxy: Proxy,
    /// "the proxy socks5://host:1080 (from all_proxy)": its URL without a
    /// password, and the variable that set it.
    shown: String,
}

/// The proxy for `url` as curl picks one: `https_proxy` (or
/// `HTTPS_PROXY`) for https URLs, `http_proxy` (lower case only: a CGI
/// program's `HTTP_PROXY` comes from a request header) for http, else
/// `all_proxy` (or `ALL_PROXY`); none for a host `no_proxy` (or
/// `NO_PROXY`) names. ureq's own reading of the environment takes the
/// first variable set whatever the URL's scheme, and matches `no_proxy`'s
/// `example.com` against that host only, where curl also skips the proxy
/// for its subdomains: so the choice is made here. Every scheme curl
/// takes works: `http://`, `https://`, `socks4://`, `socks4a://`,
/// `socks5://`, `socks5h://` (`socks://` is SOCKS5).
fn proxy_for(url: &HttpUrl) -> io::Result<Option<EnvProxy>> {
    let names: &[&str] = if url.is_https() {
        &["https_proxy", "HTTPS_PROXY"]
    } else {
        &["http_proxy"]
    };
    let Some((name, value)) = env(names).or_else(|| env(&["all_proxy", "ALL_PROXY"])) else {
        return Ok(None);
    };
    if no_proxy(
        &env(&["no_proxy", "NO_PROXY"])
            .map(|(_, v)| v)
            .unwrap_or_default(),
        url.host(),
    ) {
        return Ok(None);
    }
    let shown = format!("the proxy {} (from {name})", super::url::redact(&value));
    match Proxy::new(&value) {
        Ok(proxy) => Ok(Some(EnvProxy { proxy, shown })),
        Err(e) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{shown}: {e}"),
        )),
    }
}

/// True if curl's `no_proxy` list `list` names `host`: `*` names every
/// host; an entry (a leading dot ignored) names itself and its
/// subdomains, in any case; IPv6 brackets are ignored.
///
/// ```ignore
/// assert!(no_proxy("example.com", "www.example.com"));
/// ```
pub(crate) fn no_proxy(list: &str, host: &str) -> bool {
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    list.split(',').map(str::trim).any(|entry| {
        let entry = entry
            .trim_start_matches('.')
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        entry == "*"
            || (!entry.is_empty()
                && (host == entry
                    || host
                        .strip_suffix(&entry)
                        .is_some_and(|head| head.ends_with('.'))))
    })
}

/// A ureq failure as a [`Fail`], in words.
pub(crate) fn classify(e: ureq::Error, timeout: Option<Duration>) -> Fail {
    let timed_out = || {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "no answer within {} seconds",
                timeout.unwrap_or_default().as_secs_f64()
            ),
        )
    };
    match e {
        ureq::Error::Timeout(_) => Fail::Again(timed_out()),
        ureq::Error::Io(e) => io_fail(e, timeout),
        ureq::Error::ConnectionFailed => Fail::final_with(
            io::ErrorKind::ConnectionRefused,
            "the connection failed".into(),
        ),
        ureq::Error::HostNotFound => Fail::final_with(
            io::ErrorKind::NotFound,
            "the host name does not resolve".into(),
        ),
        ureq::Error::Rustls(t) => Fail::Final(crate::storage::nbd::tls::tls_error(&t)),
        ureq::Error::LargeResponseHeader(..) => Fail::final_with(
            io::ErrorKind::InvalidData,
            "the server's reply headers are larger than 64 KiB".into(),
        ),
        e => Fail::final_with(io::ErrorKind::InvalidData, format!("HTTP: {e}")),
    }
}

/// An I/O error of a request or its body as a [`Fail`]: a connection
/// reset, dropped or timed out is worth another try.
pub(crate) fn io_fail(e: io::Error, timeout: Option<Duration>) -> Fail {
    if e.get_ref().is_some_and(|i| i.is::<ureq::Error>()) {
        return classify(ureq::Error::from(e), timeout);
    }
    if let Some(t) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        return Fail::Final(crate::storage::nbd::tls::tls_error(t));
    }
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof
        | io::ErrorKind::TimedOut
        | io::ErrorKind::WouldBlock
        | io::ErrorKind::Interrupted => Fail::Again(e),
        _ => Fail::Final(e),
    }
}

/// Fill `buf` from a reply's body: all of it within the deadline (a
/// trickle is a timeout), and nothing after it (a body longer than the
/// range, or one that never ends, is refused once `buf` is full). The body
/// is never read past `buf` and one more byte.
pub(crate) fn read_body(
    body: &mut dyn Read,
    buf: &mut [u8],
    deadline: Option<Instant>,
    timeout: Option<Duration>,
) -> Result<(), Fail> {
    let mut done = 0;
    while done < buf.len() {
        match body.read(&mut buf[done..]) {
            Ok(0) => {
                return Err(Fail::Again(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the reply ended after {done} of {} bytes", buf.len()),
                )));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(match io_fail(e, timeout) {
                    // ureq's "Peer disconnected": say how far it came.
                    Fail::Again(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        Fail::Again(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("the reply ended after {done} of {} bytes", buf.len()),
                        ))
                    }
                    f => f,
                });
            }
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            return Err(Fail::Again(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the reply took more than {} seconds: {done} of {} bytes came",
                    timeout.unwrap_or_default().as_secs_f64(),
                    buf.len()
                ),
            )));
        }
    }
    let mut more = [0u8; 1];
    loop {
        match body.read(&mut more) {
            Ok(0) => return Ok(()),
            Ok(_) => {
                return Err(Fail::final_with(
                    io::ErrorKind::InvalidData,
                    format!("the reply is longer than the {} bytes asked for", buf.len()),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_fail(e, timeout)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Headers given to the library directly meet the rules the commands
    /// and Python parse them by: nothing breaks a request's lines.
    #[test]
    fn headers_are_checked_for_every_caller() {
        let url = HttpUrl::parse("http://127.0.0.1:9/disk.raw").unwrap();
        let with = |name: &str, value: &str| {
            let opts = HttpOptions {
                headers: vec![(name.into(), value.into())],
                ..HttpOptions::default()
            };
            Client::new(&url, &url, &opts).map(|_| ())
        };
        assert!(with("Authorization", "Bearer abc").is_ok());
        for (name, value) in [
            ("X-Token", "a\r\nRange: bytes=0-1"),
            ("X Token", "a"),
            ("Range", "bytes=0-1"),
            ("", "a"),
        ] {
            let e = with(name, value).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{name}: {e}");
        }
    }

    #[test]
    fn no_proxy_as_curl() {
        assert!(no_proxy("*", "anything"));
        assert!(no_proxy("example.com", "example.com"));
        assert!(no_proxy("example.com", "www.Example.com"));
        assert!(no_proxy(" .example.com ,other", "a.b.example.com"));
        assert!(no_proxy("localhost,127.0.0.1", "127.0.0.1"));
        assert!(no_proxy("::1", "[::1]"));
        assert!(!no_proxy("example.com", "badexample.com"));
        assert!(!no_proxy("", "example.com"));
        assert!(!no_proxy(",", "example.com"));
    }
}
