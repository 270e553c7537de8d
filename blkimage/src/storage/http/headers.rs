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
