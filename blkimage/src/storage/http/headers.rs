//! The headers a user adds to every request (`--header`), checked where
//! every caller passes.

/// Headers the client sets itself: a user's value would break a range,
/// its check or the connection.
const OWN_HEADERS: &[&str] = &[
    "range",
    "if-match",
    "if-range",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "accept-encoding",
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "te",
];

/// A header as `--header` takes it: `Name: value`. The name is an HTTP
/// token; the value has no line break; the headers the client sets itself
/// (`Range`, `If-Match`, `Accept-Encoding`, `Host`...) are refused.
///
/// ```
/// use blkimage::http::parse_header;
/// assert_eq!(
///     parse_header("Authorization: Bearer abc").unwrap(),
///     ("Authorization".to_string(), "Bearer abc".to_string())
/// );
/// assert!(parse_header("Range: bytes=0-1").is_err());
/// assert!(parse_header("no colon").is_err());
/// ```
pub fn parse_header(s: &str) -> Result<(String, String), String> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| format!("'{s}' is not a header: write 'Name: value'"))?;
    let value = value.trim_matches([' ', '\t']);
    check_header(name, value)?;
    Ok((name.to_string(), value.to_string()))
}

/// Whether a header a user gives may be sent: its name a token, not one
/// the client sets itself, its value without a control character (never a
/// line break into a request). [`parse_header`]'s rules, also applied to
/// [`super::HttpOptions::headers`] however they were made.
pub(crate) fn check_header(name: &str, value: &str) -> Result<(), String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(format!("'{name}' is not a header name"));
    }
    if OWN_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
        return Err(format!(
            "the {name} header is blkhash's own to set (it asks for ranges and checks them)"
        ));
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(format!("the value of {name} has a control character"));
    }
    Ok(())
}

/// Bytes of a headers file read at most: headers are short, and a file
/// named by mistake (an image, `/dev/zero`) is not read whole.
const MAX_HEADERS_FILE: u64 = 64 << 10;

/// The headers in the file `path`, as curl's `-H @FILE` reads them: one
/// `Name: value` a line, by [`parse_header`]'s rules (a line's end, `\n` or
/// `\r\n`, is not part of its value; blank lines are skipped). What a
/// token stays in when it must not show in `ps` or a shell's history: a
/// KubeVirt export's header secret, mounted, is such a file
/// (`x-kubevirt-export-token:TOKEN`). An error names the file, and the line
/// but never its value.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let file = dir.path().join("token");
/// std::fs::write(&file, "x-kubevirt-export-token:s3cret\n\nX-Other: 1\r\n").unwrap();
/// let headers = blkimage::http::read_headers(&file).unwrap();
/// assert_eq!(headers[0], ("x-kubevirt-export-token".into(), "s3cret".into()));
/// assert_eq!(headers[1], ("X-Other".into(), "1".into()));
/// std::fs::write(&file, "Range: bytes=0-1\n").unwrap();
/// assert!(blkimage::http::read_headers(&file).is_err());
/// ```
pub fn read_headers(path: &std::path::Path) -> std::io::Result<Vec<(String, String)>> {
    use std::io::{self, Read};
    let named = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("headers file '{}': {why}", path.display()),
        )
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_HEADERS_FILE + 1).read_to_string(&mut text))
        .map_err(|e| io::Error::new(e.kind(), format!("'{}': {e}", path.display())))?;
    if text.len() as u64 > MAX_HEADERS_FILE {
        return Err(named(format!(
            "larger than {} KiB: not a file of headers",
            MAX_HEADERS_FILE >> 10
        )));
    }
    let mut headers = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        // Never the line itself in a message: it may hold a secret (a
        // parse_header error names only the header's name).
        if !line.contains(':') {
            return Err(named(format!(
                "line {} is not a header: write 'Name: value'",
                n + 1
            )));
        }
        let header = parse_header(line).map_err(|e| named(format!("line {}: {e}", n + 1)))?;
        headers.push(header);
    }
    if headers.is_empty() {
        return Err(named("no header in it".into()));
    }
    Ok(headers)
}
