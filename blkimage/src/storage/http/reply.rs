//! What a server says about the bytes it sends, parsed strictly: the
//! `Content-Range` of a reply (RFC 9110 section 14.4) and the validators
//! that name a file's version (`ETag`, section 8.8.3; `Last-Modified`,
//! section 8.8.2). The HTTP client parses the rest of a reply (status,
//! headers, body framing); these header values are ours to read, and a
//! server's bytes, so they are fuzzed (fuzz/fuzz_targets/http_reply.rs).

use std::fmt;

/// Headers a reply may have (nginx sends 8), in the replies parsed
/// here (`direct.rs`, `interim.rs`): ureq-proto's limit, so a
/// reply either path refuses the other refuses too.
pub(crate) const MAX_HEADERS: usize = 128;

/// A `Content-Range` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentRange {
    /// `bytes FIRST-LAST/COMPLETE` (`COMPLETE` `*` when unknown): the reply
    /// holds bytes `first..=last`. Always `first <= last` and, with a
    /// complete length, `last < complete`.
    Bytes {
        /// The first byte's offset.
        first: u64,
        /// The last byte's offset (inclusive).
        last: u64,
        /// The file's length, if the server says.
        complete: Option<u64>,
    },
    /// `bytes */COMPLETE`: a 416 reply's, the range asked for is not in a
    /// file of this length.
    Unsatisfied {
        /// The file's length.
        complete: u64,
    },
}

/// A decimal number as HTTP writes one: ASCII digits only, no sign or
/// space, no overflow.
fn number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

impl ContentRange {
    /// Parse a `Content-Range` value; `None` if it is not one (any other
    /// unit than `bytes`, a range that ends before it starts or past the
    /// complete length, a number too large, stray characters).
    ///
    /// ```
    /// use blkimage::http::ContentRange;
    /// assert_eq!(
    ///     ContentRange::parse("bytes 0-511/4096"),
    ///     Some(ContentRange::Bytes { first: 0, last: 511, complete: Some(4096) })
    /// );
    /// assert_eq!(ContentRange::parse("bytes */0"), Some(ContentRange::Unsatisfied { complete: 0 }));
    /// assert_eq!(ContentRange::parse("bytes 512-0/4096"), None);
    /// assert_eq!(ContentRange::parse("bytes 0-4096/4096"), None);
    /// ```
    pub fn parse(value: &str) -> Option<ContentRange> {
        let (unit, rest) = value.split_once(' ')?;
        if !unit.eq_ignore_ascii_case("bytes") {
            return None;
        }
        let (range, complete) = rest.split_once('/')?;
        if range == "*" {
            return Some(ContentRange::Unsatisfied {
                complete: number(complete)?,
            });
        }
        let (first, last) = range.split_once('-')?;
        let (first, last) = (number(first)?, number(last)?);
        let complete = match complete {
            "*" => None,
            n => Some(number(n)?),
        };
        if first > last || complete.is_some_and(|c| last >= c) {
            return None;
        }
        Some(ContentRange::Bytes {
            first,
            last,
            complete,
        })
    }
}

impl fmt::Display for ContentRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContentRange::Bytes {
                first,
                last,
                complete: Some(c),
            } => write!(f, "bytes {first}-{last}/{c}"),
            ContentRange::Bytes { first, last, .. } => write!(f, "bytes {first}-{last}/*"),
            ContentRange::Unsatisfied { complete } => write!(f, "bytes */{complete}"),
        }
    }
}

/// An entity tag: `"opaque"` (strong) or `W/"opaque"` (weak).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ETag {
    /// Weak tags (`W/`) say two versions are equivalent, not that their
    /// bytes are equal: they never make a request conditional here.
    pub weak: bool,
    /// The tag with its quotes, as the server wrote it.
    pub tag: String,
}

impl ETag {
    /// Parse an `ETag` value; `None` if it is not one.
    ///
    /// ```
    /// use blkimage::http::ETag;
    /// assert!(!ETag::parse("\"5f3a-1e00\"").unwrap().weak);
    /// assert!(ETag::parse("W/\"x\"").unwrap().weak);
    /// assert!(ETag::parse("no-quotes").is_none());
    /// ```
    pub fn parse(value: &str) -> Option<ETag> {
        let (weak, tag) = match value.strip_prefix("W/") {
            Some(t) => (true, t),
            None => (false, value),
        };
        let inner = tag.strip_prefix('"')?.strip_suffix('"')?;
        // etagc: %x21 / %x23-7E / obs-text (as UTF-8 here): no quote,
        // space or control inside.
        if inner.bytes().any(|b| b == b'"' || b <= b' ' || b == 0x7f) {
            return None;
        }
        Some(ETag {
            weak,
            tag: tag.to_string(),
        })
    }

    /// The value as a header carries it.
    pub fn value(&self) -> String {
        if self.weak {
            format!("W/{}", self.tag)
        } else {
            self.tag.clone()
        }
    }
}

/// What names the version of a file: its length and validators, as taken
/// when it was opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// The file's length in bytes.
    pub len: u64,
    /// Its entity tag, if the server sent one.
    pub etag: Option<ETag>,
    /// Its `Last-Modified` date as the server wrote it, if it did.
    pub last_modified: Option<String>,
}

impl Version {
    /// The conditional header every range request carries, so that the
    /// server itself refuses to mix versions: `If-Match` with a strong
    /// ETag (another version: 412), else `If-Range` with the date (another
    /// version: the whole file, 200, which is then refused unread). A weak
    /// ETag can be neither (RFC 9110 forbids it in both); then, and with
    /// no validator, only the replies' own validators are compared.
    pub fn condition(&self) -> Option<(&'static str, String)> {
        match (&self.etag, &self.last_modified) {
            (Some(e), _) if !e.weak => Some(("If-Match", e.tag.clone())),
            (_, Some(date)) => Some(("If-Range", date.clone())),
            _ => None,
        }
    }

    /// How a reply's validators show another version than this, if they
    /// do: an ETag that differs (compared weakly), dropped or added (a
    /// partial reply carries the ETag a whole one would, RFC 9110 section
    /// 15.3.7; a value that is not an entity tag counts as none), or a
    /// `Last-Modified` the reply carries that is not this
    /// version's (it need not carry one). `etag` and `last_modified` are
    /// the reply's header values, if any.
    pub fn differs(&self, etag: Option<&str>, last_modified: Option<&str>) -> Option<String> {
        // A value that is not an entity tag is no validator: ignored here
        // as it was when the file was opened.
        let theirs = etag.and_then(ETag::parse).map(|e| e.tag);
        let ours = self.etag.as_ref().map(|e| e.tag.clone());
        if theirs != ours {
            return Some(format!(
                "its ETag was {}, the server now sends {}",
                ours.as_deref().unwrap_or("none"),
                theirs.as_deref().unwrap_or("none")
            ));
        }
        if let Some(theirs) = last_modified
            && Some(theirs) != self.last_modified.as_deref()
        {
            return Some(format!(
                "it was last modified {}, the server now says {}",
                self.last_modified.as_deref().unwrap_or("(not said)"),
                theirs
            ));
        }
        None
    }
}

/// What [`check_range`] finds wrong with a reply to a range request.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RangeError {
    /// The reply is of another version of the file (its length or
    /// validators differ): the run must stop.
    Changed(String),
    /// The reply does not hold the range asked for.
    Wrong(String),
}

/// Check a 206 reply to a request for bytes `first..=last` of `version`:
/// its `Content-Range` (`None`: absent) must be exactly the range, of a
/// file of the same length, and its validators those of the version.
pub fn check_range(
    version: &Version,
    first: u64,
    last: u64,
    content_range: Option<&str>,
    etag: Option<&str>,
    last_modified: Option<&str>,
) -> Result<(), RangeError> {
    let asked = format!("bytes {first}-{last}");
    let value = content_range.ok_or_else(|| {
        RangeError::Wrong(format!(
            "a partial reply without Content-Range (asked for {asked})"
        ))
    })?;
    match ContentRange::parse(value) {
        Some(ContentRange::Bytes {
            first: f,
            last: l,
            complete,
        }) => {
            if let Some(c) = complete.filter(|&c| c != version.len) {
                return Err(RangeError::Changed(format!(
                    "its length was {} bytes, the server now says {c}",
                    version.len
                )));
            }
            if (f, l) != (first, last) {
                return Err(RangeError::Wrong(format!(
                    "the server sent bytes {f}-{l} for {asked}"
                )));
            }
        }
        _ => {
            return Err(RangeError::Wrong(format!(
                "a malformed Content-Range '{}' (asked for {asked})",
                value.escape_debug()
            )));
        }
    }
    match version.differs(etag, last_modified) {
        Some(why) => Err(RangeError::Changed(why)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges() {
        let ok = |s| ContentRange::parse(s).unwrap_or_else(|| panic!("{s}"));
        assert_eq!(
            ok("BYTES 5-5/*"),
            ContentRange::Bytes {
                first: 5,
                last: 5,
                complete: None
            }
        );
        for bad in [
            "",
            "bytes",
            "bytes 0-1",
            "bytes 0-1/",
            "bytes -1-2/3",
            "bytes +0-1/3",
            "bytes 0 -1/3",
            "bytes 0-1/3 ",
            "items 0-1/3",
            "bytes 0-18446744073709551616/*",
            "bytes */*",
            "bytes 1-0/3",
            "bytes 0-3/3",
        ] {
            assert_eq!(ContentRange::parse(bad), None, "{bad:?}");
        }
        for s in ["bytes 0-0/1", "bytes 7-9/*", "bytes */12"] {
            assert_eq!(ok(s).to_string(), s);
        }
    }

    #[test]
    fn versions() {
        let v = Version {
            len: 100,
            etag: ETag::parse("\"a\""),
            last_modified: Some("Mon, 01 Jan 2024 00:00:00 GMT".into()),
        };
        assert_eq!(v.condition(), Some(("If-Match", "\"a\"".into())));
        let lm = v.last_modified.as_deref();
        assert_eq!(
            check_range(&v, 0, 9, Some("bytes 0-9/100"), Some("\"a\""), lm),
            Ok(())
        );
        // A weak form of the same tag is the same version.
        assert_eq!(
            check_range(&v, 0, 9, Some("bytes 0-9/100"), Some("W/\"a\""), lm),
            Ok(())
        );
        assert!(matches!(
            check_range(&v, 0, 9, Some("bytes 0-9/101"), Some("\"a\""), lm),
            Err(RangeError::Changed(_))
        ));
        assert!(matches!(
            check_range(&v, 0, 9, Some("bytes 0-9/100"), Some("\"b\""), lm),
            Err(RangeError::Changed(_))
        ));
        assert_eq!(
            check_range(&v, 0, 9, Some("bytes 0-9/100"), Some("\"a\""), None),
            Ok(())
        );
        assert!(matches!(
            check_range(&v, 0, 9, Some("bytes 0-9/100"), Some("\"a\""), Some("x")),
            Err(RangeError::Changed(_))
        ));
        assert!(matches!(
            check_range(&v, 0, 9, Some("bytes 0-9/100"), None, lm),
            Err(RangeError::Changed(_))
        ));
        assert!(matches!(
            check_range(&v, 0, 9, Some("bytes 1-9/100"), Some("\"a\""), lm),
            Err(RangeError::Wrong(_))
        ));
        assert!(matches!(
            check_range(&v, 0, 9, None, Some("\"a\""), lm),
            Err(RangeError::Wrong(_))
        ));
        let weak = Version {
            etag: ETag::parse("W/\"a\""),
            ..v.clone()
        };
        assert_eq!(weak.condition().unwrap().0, "If-Range");
        let bare = Version {
            len: 1,
            etag: None,
            last_modified: None,
        };
        assert_eq!(bare.condition(), None);
    }
}
