//! HTTP(S) URLs: telling them from file names, showing them without their
//! password, following a redirect, and resolving the name a remote qcow2
//! image gives its backing or data file. Parsing and resolution are the
//! `url` crate's (RFC 3986 references as the WHATWG URL standard resolves
//! them); what is ours is which results are allowed.

use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use std::borrow::Cow;
use std::io;

/// True if `name` is an HTTP or HTTPS URL (by its scheme, in any case).
///
/// ```
/// assert!(blkimage::http::is_url("https://example.com/disk.qcow2"));
/// assert!(blkimage::http::is_url("HTTP://example.com/disk.raw"));
/// assert!(!blkimage::http::is_url("nbd://example.com/disk"));
/// assert!(!blkimage::http::is_url("http.img"));
/// ```
pub fn is_url(name: &str) -> bool {
    ["http://", "https://"].iter().any(|s| {
        name.get(..s.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(s))
    })
}

/// `name` with the password of a `scheme://user:password@host` URL
/// replaced by `***`, as every message and output line shows it; any
/// other name as it is.
///
/// ```
/// use blkimage::http::redact;
/// assert_eq!(redact("https://me:s3cret@host/d.qcow2"), "https://me:***@host/d.qcow2");
/// assert_eq!(redact("https://host/d.qcow2?X-Amz-Signature=1"), "https://host/d.qcow2?X-Amz-Signature=1");
/// assert_eq!(redact("/images/a:b@c"), "/images/a:b@c");
/// ```
pub fn redact(name: &str) -> Cow<'_, str> {
    let Some(at) = name.find("://") else {
        return Cow::Borrowed(name);
    };
    let scheme = &name[..at];
    let valid_scheme = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    if !valid_scheme {
        return Cow::Borrowed(name);
    }
    let rest = &name[at + 3..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let Some(userinfo) = authority.rfind('@').map(|i| &authority[..i]) else {
        return Cow::Borrowed(name);
    };
    match userinfo.find(':') {
        Some(colon) => {
            let start = at + 3 + colon + 1;
            let end = at + 3 + userinfo.len();
            Cow::Owned(format!("{}***{}", &name[..start], &name[end..]))
        }
        None => Cow::Borrowed(name),
    }
}

/// Bytes a backing file name may not carry into a URL as they are: a
/// file name is literal, so `?`, `#` and `%` in it are characters of the
/// name, not a query, a fragment or an escape.
const NAME_ESCAPES: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'\\')
    .add(b'^')
    .add(b'|');

fn invalid(what: &str, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("invalid URL '{}': {why}", redact(what)),
    )
}

/// A parsed HTTP or HTTPS URL.
#[derive(Clone, Debug)]
pub struct HttpUrl {
    url: url::Url,
    /// As given (for a redirect target, as resolved), password redacted.
    shown: String,
}

impl HttpUrl {
    /// Parse an `http://` or `https://` URL; an error names it (password
    /// redacted) and what is wrong with it.
    ///
    /// ```
    /// use blkimage::http::HttpUrl;
    /// let u = HttpUrl::parse("https://u:p@images.example/f/disk.qcow2?sig=1#x").unwrap();
    /// assert_eq!(u.shown(), "https://u:***@images.example/f/disk.qcow2?sig=1#x");
    /// assert_eq!(u.recorded(), "https://images.example/f/disk.qcow2");
    /// assert!(HttpUrl::parse("https://").is_err());
    /// assert!(HttpUrl::parse("https://[::1/disk").is_err());
    /// ```
    pub fn parse(s: &str) -> io::Result<HttpUrl> {
        let url = url::Url::parse(s).map_err(|e| invalid(s, e))?;
        HttpUrl::checked(url, redact(s).into_owned(), s)
    }

    fn checked(url: url::Url, shown: String, given: &str) -> io::Result<HttpUrl> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(given, "not http:// or https://"));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(invalid(given, "no host"));
        }
        Ok(HttpUrl { url, shown })
    }

    /// The URL as given, any password replaced by `***`.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// True for `https://`.
    pub fn is_https(&self) -> bool {
        self.url.scheme() == "https"
    }

    /// The host, as the URL names it (IPv6 addresses in brackets).
    pub fn host(&self) -> &str {
        self.url.host_str().unwrap_or_default()
    }

    /// True if the URL names a KubeVirt VirtualMachineExport's volume:
    /// its path ends in `/volumes/PVC/disk.img` or `disk.img.gz` (through
    /// the export proxy or the export's own service).
    pub(crate) fn is_kubevirt_export(&self) -> bool {
        let Some(segments) = self.url.path_segments() else {
            return false;
        };
        let mut last = segments.rev();
        matches!(
            (last.next(), last.next(), last.next()),
            (Some("disk.img" | "disk.img.gz"), Some(pvc), Some("volumes")) if !pvc.is_empty()
        )
    }

    /// `host:port`, for messages about connecting.
    pub(crate) fn authority(&self) -> String {
        format!(
            "{}:{}",
            self.host(),
            self.url.port_or_known_default().unwrap_or_default()
        )
    }

    /// What identifies the file, in a record: scheme, host, port and path,
    /// without user, password, query or fragment (an S3 presigned URL's
    /// query is a credential that changes each time it is signed again;
    /// the file's version is told by its validators, not its URL).
    pub fn recorded(&self) -> String {
        let mut u = self.url.clone();
        let _ = u.set_username("");
        let _ = u.set_password(None);
        u.set_query(None);
        u.set_fragment(None);
        u.to_string()
    }

    /// The URL requests go to: no user or password (they go in an
    /// Authorization header), no fragment (never sent).
    pub(crate) fn request_url(&self) -> String {
        let mut u = self.url.clone();
        let _ = u.set_username("");
        let _ = u.set_password(None);
        u.set_fragment(None);
        u.to_string()
    }

    /// What an HTTP/1.1 request line names: the path and query.
    pub(crate) fn request_target(&self) -> &str {
        &self.url[url::Position::BeforePath..url::Position::AfterQuery]
    }

    /// A request's `Host` header: the host, and the port if the URL gives
    /// one.
    pub(crate) fn host_header(&self) -> &str {
        &self.url[url::Position::BeforeHost..url::Position::AfterPort]
    }

    /// The addresses the host resolves to, with the URL's port.
    pub(crate) fn socket_addrs(&self) -> io::Result<Vec<std::net::SocketAddr>> {
        self.url.socket_addrs(|| None)
    }

    /// The user and password in the URL, percent-decoded, for basic auth.
    pub(crate) fn credentials(&self) -> Option<(String, String)> {
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let user = self.url.username();
        let password = self.url.password();
        (!user.is_empty() || password.is_some())
            .then(|| (decode(user), password.map(decode).unwrap_or_default()))
    }

    /// Scheme, host and port: where headers given for this URL may go.
    pub(crate) fn origin(&self) -> url::Origin {
        self.url.origin()
    }

    /// The target of a redirect (`Location`, absolute or relative to this
    /// URL). HTTPS never redirects to plain HTTP: the rest would travel in
    /// clear, credentials included.
    pub(crate) fn redirect(&self, location: &str) -> io::Result<HttpUrl> {
        let target = self.url.join(location).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a redirect to an invalid URL '{}': {e}", redact(location)),
            )
        })?;
        let shown = redact(target.as_str()).into_owned();
        let next = HttpUrl::checked(target, shown, location).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a redirect to '{}', not an HTTP(S) URL", redact(location)),
            )
        })?;
        if self.is_https() && !next.is_https() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "a redirect from HTTPS to plain HTTP ({}): refused",
                    next.shown()
                ),
            ));
        }
        Ok(next)
    }

    /// The URL of the file a remote image names `name` (its backing or
    /// external data file), resolved against this URL as QEMU resolves a
    /// relative name against the image's. Only a relative name is
    /// accepted: an absolute path, `file:` or any other scheme (`json:`,
    /// `nbd:`, another host's URL) would make a published image read this
    /// host's files or reach servers the user did not name.
    ///
    /// ```
    /// use blkimage::http::HttpUrl;
    /// let top = HttpUrl::parse("https://h/images/top.qcow2?sig=x").unwrap();
    /// assert_eq!(top.sibling(b"base.qcow2").unwrap().shown(), "https://h/images/base.qcow2");
    /// assert_eq!(top.sibling(b"../b 1.raw").unwrap().shown(), "https://h/b%201.raw");
    /// assert!(top.sibling(b"/etc/passwd").is_err());
    /// assert!(top.sibling(b"file:/etc/passwd").is_err());
    /// assert!(top.sibling(b"//other.host/x").is_err());
    /// ```
    pub fn sibling(&self, name: &[u8]) -> io::Result<HttpUrl> {
        let refused = |why: &str| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "'{}' {why}: a remote image may only name files beside it, by a relative name",
                    String::from_utf8_lossy(name)
                ),
            )
        };
        let name = std::str::from_utf8(name).map_err(|_| refused("is not UTF-8"))?;
        if name.starts_with('/') {
            return Err(refused("is an absolute path (a file of this host)"));
        }
        if has_scheme(name) {
            return Err(refused("names a protocol or another host"));
        }
        let encoded: String = utf8_percent_encode(name, NAME_ESCAPES).collect();
        let joined = self
            .url
            .join(&encoded)
            .map_err(|e| refused(&e.to_string()))?;
        if joined.origin() != self.url.origin() {
            return Err(refused("resolves to another host"));
        }
        let shown = redact(joined.as_str()).into_owned();
        HttpUrl::checked(joined, shown, name)
    }
}

/// True if `s` starts with a URL scheme (`letter *(letter / digit / + - .)`
/// then `:`): `file:`, `json:`, `http:`.
fn has_scheme(s: &str) -> bool {
    match s.find(':') {
        Some(i) => {
            let scheme = &s[..i];
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        }
        None => false,
    }
}

/// The scheme of `name` if it looks like a URL (`scheme://`), for the
/// message that tells a misspelt scheme from a missing file.
///
/// ```
/// assert_eq!(blkimage::http::url_scheme("ndb://host/x"), Some("ndb"));
/// assert_eq!(blkimage::http::url_scheme("disk.img"), None);
/// assert_eq!(blkimage::http::url_scheme("./a://b"), None);
/// ```
pub fn url_scheme(name: &str) -> Option<&str> {
    let (scheme, _) = name.split_once("://")?;
    has_scheme(&format!("{scheme}:")).then_some(scheme)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_shown() {
        assert_eq!(redact("http://a:b@h/x"), "http://a:***@h/x");
        assert_eq!(redact("http://a@h/x"), "http://a@h/x");
        assert_eq!(redact("http://a:b:c@d@h/x"), "http://a:***@h/x");
        assert_eq!(redact("ftp://u:p@h"), "ftp://u:***@h");
        assert_eq!(redact("http://h/a:b@c"), "http://h/a:b@c");
        assert_eq!(redact("http://h?x=a:b@c"), "http://h?x=a:b@c");
        let u = HttpUrl::parse("https://u:p%40ss@h:8443/x").unwrap();
        assert_eq!(u.credentials(), Some(("u".into(), "p@ss".into())));
        assert_eq!(u.request_url(), "https://h:8443/x");
        assert!(!u.recorded().contains("p%40ss"));
        let r = u.redirect("https://v:q@h/y").unwrap();
        assert_eq!(r.shown(), "https://v:***@h/y");
    }

    #[test]
    fn redirects() {
        let u = HttpUrl::parse("https://h/a/b?q=1").unwrap();
        assert_eq!(u.redirect("c").unwrap().shown(), "https://h/a/c");
        assert_eq!(u.redirect("/z").unwrap().shown(), "https://h/z");
        assert_eq!(
            u.redirect("//cdn.example/z").unwrap().shown(),
            "https://cdn.example/z"
        );
        let e = u.redirect("http://h/x").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(u.redirect("ftp://h/x").is_err());
        let plain = HttpUrl::parse("http://h/a").unwrap();
        assert!(plain.redirect("https://h/b").unwrap().is_https());
    }

    #[test]
    fn request_parts() {
        let u = HttpUrl::parse("http://u:p@[::1]:8080/d/disk.raw?sig=a%20b#frag").unwrap();
        assert_eq!(u.request_target(), "/d/disk.raw?sig=a%20b");
        assert_eq!(u.host_header(), "[::1]:8080");
        let u = HttpUrl::parse("http://images.example:80/disk.raw").unwrap();
        assert_eq!(u.request_target(), "/disk.raw");
        assert_eq!(u.host_header(), "images.example");
        let u = HttpUrl::parse("http://127.0.0.1:9").unwrap();
        assert_eq!(u.request_target(), "/");
        assert_eq!(u.socket_addrs().unwrap(), ["127.0.0.1:9".parse().unwrap()]);
    }

    #[test]
    fn backing_names() {
        let u = HttpUrl::parse("http://h:81/d/top.qcow2").unwrap();
        assert_eq!(
            u.sibling(b"a?b#c%d").unwrap().shown(),
            "http://h:81/d/a%3Fb%23c%25d"
        );
        assert_eq!(u.sibling(b"../../../x").unwrap().shown(), "http://h:81/x");
        for bad in [
            &b"/proc/self/mem"[..],
            b"file:///etc/passwd",
            b"json:{}",
            b"nbd://h/x",
            b"http://other/x",
            b"\xff",
        ] {
            assert!(u.sibling(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn schemes() {
        assert_eq!(url_scheme("ftp://h/x"), Some("ftp"));
        assert_eq!(url_scheme("nbd+unix:///x"), Some("nbd+unix"));
        assert_eq!(url_scheme("1x://h"), None);
        assert_eq!(url_scheme("dir/x://h"), None);
        assert!(is_url("https://x"));
        assert!(!is_url("https:/x"));
    }
}
