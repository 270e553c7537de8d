//! NBD URLs as libnbd spells them:
//! `nbd://host[:port][/export]`, `nbd+unix:///export?socket=PATH`, and the
//! TLS forms `nbds://` and `nbds+unix://` (queries `tls-certificates=DIR`
//! and `tls-hostname=NAME`, as libnbd has them).

use std::io;
use std::path::PathBuf;

pub const DEFAULT_PORT: u16 = 10809;

/// Where the server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// A TCP host (a name or an address) and port.
    Tcp {
        /// The host as the URL names it.
        host: String,
        /// The port (10809 unless the URL says).
        port: u16,
    },
    /// A unix socket's path.
    Unix(PathBuf),
}

/// A parsed NBD URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUrl {
    /// Where the server listens.
    pub address: Address,
    /// The export name (empty: the server's default export).
    pub export: String,
    /// Whether the URL asks for TLS (`nbds://`, `nbds+unix://`).
    pub tls: bool,
    /// A directory with ca-cert.pem (and client-cert.pem, client-key.pem).
    pub tls_certificates: Option<PathBuf>,
    /// The name the server's certificate must be valid for, instead of
    /// the URL's host (or "localhost" for a unix socket).
    pub tls_hostname: Option<String>,
}

/// True if `name` is an NBD URL (by its scheme).
pub fn is_url(name: &str) -> bool {
    // The vsock schemes are URLs too (libnbd's), refused by name when
    // parsed rather than taken for file names.
    [
        "nbd://",
        "nbds://",
        "nbd+unix://",
        "nbds+unix://",
        "nbd+vsock://",
        "nbds+vsock://",
    ]
    .iter()
    .any(|s| name.starts_with(s))
}

fn bad(url: &str, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("invalid NBD URL '{url}': {why}"),
    )
}

fn percent_decode(s: &str, url: &str) -> io::Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| bad(url, "bad percent escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad(url, "not UTF-8"))
}

/// The address of a TCP URL from its authority (`HOST`, `HOST:PORT`,
/// `[IPV6]:PORT`; no host is localhost, no port NBD's).
fn tcp_address(authority: &str, url: &str) -> io::Result<Address> {
    let (host, port) = if let Some(r) = authority.strip_prefix('[') {
        let (h, p) = r.split_once(']').ok_or_else(|| bad(url, "bad IPv6 host"))?;
        (h.to_string(), p.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    let port = match port {
        Some(p) => p.parse().map_err(|_| bad(url, "bad port"))?,
        None => DEFAULT_PORT,
    };
    let host = if host.is_empty() {
        "localhost".to_string()
    } else {
        host
    };
    Ok(Address::Tcp { host, port })
}

impl NbdUrl {
    /// Parse an NBD URL (`nbd://`, `nbd+unix://`, `nbds://`, `nbds+unix://`);
    /// an error names the URL and what is wrong with it.
    pub fn parse(url: &str) -> io::Result<NbdUrl> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad(url, "no scheme"))?;
        let (tls, unix) = match scheme {
            "nbd" => (false, false),
            "nbds" => (true, false),
            "nbd+unix" => (false, true),
            "nbds+unix" => (true, true),
            "nbd+vsock" | "nbds+vsock" => {
                return Err(bad(
                    url,
                    "AF_VSOCK (nbd+vsock://) is not supported: reach the server over TCP \
                     (nbd://) or a unix socket (nbd+unix://)",
                ));
            }
            _ => return Err(bad(url, "unknown scheme")),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let rest = rest.split('#').next().unwrap_or_default();
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = percent_decode(path, url)?;
        let mut socket = None;
        let mut tls_certificates = None;
        let mut tls_hostname = None;
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v, url)?;
            match k {
                "socket" => socket = Some(PathBuf::from(v)),
                "tls-certificates" => tls_certificates = Some(PathBuf::from(v)),
                "tls-hostname" if !v.is_empty() => tls_hostname = Some(v),
                // libnbd's other parameters (tls-verify-peer, ...) are not
                // supported: refuse rather than ignore them.
                _ => return Err(bad(url, &format!("unsupported query parameter '{k}'"))),
            }
        }
        let address = if unix {
            if !authority.is_empty() {
                return Err(bad(url, "a unix socket URL has no host"));
            }
            Address::Unix(socket.ok_or_else(|| bad(url, "no socket=PATH"))?)
        } else {
            if socket.is_some() {
                return Err(bad(url, "socket= needs nbd+unix://"));
            }
            tcp_address(authority, url)?
        };
        Ok(NbdUrl {
            address,
            export,
            tls,
            tls_certificates,
            tls_hostname,
        })
    }

    /// The name the server's TLS certificate is checked against: the
    /// `tls-hostname=` query parameter, else the host of a TCP URL, else
    /// "localhost" (a unix socket has no host; libnbd does the same).
    ///
    /// ```
    /// use blkimage::nbd::NbdUrl;
    /// let u = NbdUrl::parse("nbds://nbd.example:10809/disk").unwrap();
    /// assert_eq!(u.tls_server_name(), "nbd.example");
    /// let u = NbdUrl::parse("nbds+unix:///disk?socket=/run/nbd.sock").unwrap();
    /// assert_eq!(u.tls_server_name(), "localhost");
    /// let u = NbdUrl::parse("nbds+unix:///?socket=/s&tls-hostname=nbd.example").unwrap();
    /// assert_eq!(u.tls_server_name(), "nbd.example");
    /// ```
    pub fn tls_server_name(&self) -> &str {
        match (&self.tls_hostname, &self.address) {
            (Some(h), _) => h,
            (None, Address::Tcp { host, .. }) => host,
            (None, Address::Unix(_)) => "localhost",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = NbdUrl::parse("nbd://example.com:1234/disk%201").unwrap();
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "example.com".into(),
                port: 1234
            }
        );
        assert_eq!(u.export, "disk 1");
        assert!(!u.tls);
        let u = NbdUrl::parse("nbd://[::1]/").unwrap();
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "::1".into(),
                port: 10809
            }
        );
        assert_eq!(u.export, "");
        let u = NbdUrl::parse("nbd+unix:///exp?socket=/tmp/s.sock").unwrap();
        assert_eq!(u.address, Address::Unix("/tmp/s.sock".into()));
        assert_eq!(u.export, "exp");
        let u = NbdUrl::parse("nbds+unix://?socket=/s&tls-certificates=/pki").unwrap();
        assert!(u.tls);
        assert_eq!(u.tls_certificates, Some("/pki".into()));
        assert_eq!(u.tls_server_name(), "localhost");
        let u = NbdUrl::parse("nbds+unix://?socket=/s&tls-hostname=nbd.example").unwrap();
        assert_eq!(u.tls_server_name(), "nbd.example");
        let u = NbdUrl::parse("nbds://[::1]:1234/x").unwrap();
        assert_eq!(u.tls_server_name(), "::1");
        assert!(NbdUrl::parse("nbd+unix:///x").is_err());
        assert!(NbdUrl::parse("nbd://h:port/").is_err());
        assert!(NbdUrl::parse("nbd://h/?foo=1").is_err());
        assert!(NbdUrl::parse("http://h/").is_err());
        assert!(is_url("nbds+unix:///"));
        assert!(!is_url("disk.img"));
        // vsock: a URL, refused by name (not "No such file or directory").
        assert!(is_url("nbd+vsock://2:10809"));
        let e = NbdUrl::parse("nbd+vsock://2:10809")
            .unwrap_err()
            .to_string();
        assert!(e.contains("AF_VSOCK") && e.contains("not supported"), "{e}");
    }
}
