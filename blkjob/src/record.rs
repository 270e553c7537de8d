//! The record a checkpoint keeps of the image it is of, to refuse resuming
//! into a checksum of another image, or of this one changed since.
//!
//! An image is more than the file named: a qcow2 overlay reads its backing
//! chain and its external data file, a vmdk its extents. The record holds
//! every file the image reads (as [`blkimage::Source::files`] lists them,
//! by canonical path) with what tells that it changed: device, inode, size,
//! modification and change times. An NBD export has no file to look at:
//! the record holds its address and export name (the URL has no secret in
//! it: TLS keys are files named by path), and resuming also compares
//! sampled data blocks; what a checkpoint of an export can and cannot prove
//! is said in the README ("Hashing in parts, resuming"). A file read over
//! HTTP(S) (the image, its backing and data files) is recorded by its URL
//! (without user, password or query: a presigned URL's signature changes
//! when it is signed again, the file does not), its length, and the
//! validators its server gave (ETag, Last-Modified): another version of the
//! file differs in one of them.
//!
//! The record is text, a field per line, signed with its SHA-256:
//!
//! ```text
//! blkhash-input 1
//! size <the image's guest size in bytes>
//! nbd <tcp HOST:PORT | unix SOCKET> <tls|plain> <export name>      (an export)
//! http <url> <size> <etag|-> <last-modified|->           (each file read over HTTP)
//! file <file|block> <dev> <ino> <rdev> <size> <mtime> <ctime> <path>  (each file read)
//! sha256 <SHA-256 of the lines above, hex>
//! ```
//!
//! Names are percent-escaped (any byte outside `!`..`~`, and `%`), so that
//! a line splits on spaces and any file name survives.

use blkhash::{Algorithm, to_hex};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

const MAGIC: &str = "blkhash-input 1";

/// What identifies a file's content: where it is and when it last changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The canonical path.
    pub path: PathBuf,
    /// A block device (whose times do not follow writes) or a file.
    pub block: bool,
    /// The device the file is on.
    pub dev: u64,
    /// The inode number.
    pub ino: u64,
    /// The device number of a block device.
    pub rdev: u64,
    /// The size in bytes (a block device's: 0; the image's size covers it).
    pub size: u64,
    /// Last modification (seconds, nanoseconds).
    pub mtime: (i64, i64),
    /// Last status change (seconds, nanoseconds): changes on any write,
    /// even one that restores mtime.
    pub ctime: (i64, i64),
}

impl Stamp {
    /// The stamp of the file at `path` as it is now.
    pub fn of(path: &Path) -> io::Result<Stamp> {
        let path = std::fs::canonicalize(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let m = std::fs::metadata(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let block = m.file_type().is_block_device();
        Ok(Stamp {
            block,
            dev: m.dev(),
            ino: m.ino(),
            rdev: m.rdev(),
            size: if block { 0 } else { m.len() },
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            path,
        })
    }

    /// How the file changed between this stamp and `now`, if it did; `it`
    /// is how the message calls the file.
    fn changed(&self, now: &Stamp, it: &str, saved: &str) -> Option<String> {
        if (self.dev, self.ino, self.rdev, self.block) != (now.dev, now.ino, now.rdev, now.block) {
            return Some(format!(
                "{it} is another file or device than the one {saved} was saved for"
            ));
        }
        if self.size != now.size {
            return Some(format!(
                "{it} changed size from {} to {} bytes",
                self.size, now.size
            ));
        }
        // A device's times do not follow writes to it: samples check those.
        if !self.block && (self.mtime, self.ctime) != (now.mtime, now.ctime) {
            let (what, t, then) = if self.mtime != now.mtime {
                ("modification", now.mtime, self.mtime)
            } else {
                ("change", now.ctime, self.ctime)
            };
            return Some(format!(
                "{it} was written after {saved} was saved (its {what} time is {}, {saved} recorded {})",
                when(t),
                when(then)
            ));
        }
        None
    }
}

/// The record of an image: its size, and the files it reads or the
/// export it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The guest size in bytes.
    pub size: u64,
    /// An NBD export: its address, TLS or not, and export name.
    pub export: Option<String>,
    /// The files read, in the order the image opened them.
    pub files: Vec<Stamp>,
    /// The files read over HTTP(S), in the order the image opened them.
    pub http: Vec<blkimage::http::RemoteFile>,
}

impl Record {
    /// The record of the image `name` (a path or an NBD URL) opened as
    /// `src`.
    pub fn of(name: &OsStr, src: &dyn blkimage::Source) -> io::Result<Record> {
        let export = match name.to_str().filter(|n| blkimage::nbd::is_url(n)) {
            Some(url) => Some(export_of(url)?),
            None => None,
        };
        let files = src
            .files()
            .iter()
            .map(|p| Stamp::of(p))
            .collect::<io::Result<_>>()?;
        Ok(Record {
            size: src.size(),
            export,
            files,
            http: src.remote_files(),
        })
    }

    fn body(&self) -> String {
        let mut s = format!("{MAGIC}\nsize {}\n", self.size);
        if let Some(e) = &self.export {
            s += &format!("nbd {e}\n");
        }
        for h in &self.http {
            // "-" is no value; a value "-" is escaped.
            let word = |v: &Option<String>| match v.as_deref() {
                None => "-".to_string(),
                Some("-") => "%2D".to_string(),
                Some(v) => escape(v.as_bytes()),
            };
            s += &format!(
                "http {} {} {} {}\n",
                escape(h.url.as_bytes()),
                h.size,
                word(&h.etag),
                word(&h.last_modified)
            );
        }
        for f in &self.files {
            s += &format!(
                "file {} {} {} {} {} {}.{:09} {}.{:09} {}\n",
                if f.block { "block" } else { "file" },
                f.dev,
                f.ino,
                f.rdev,
                f.size,
                f.mtime.0,
                f.mtime.1,
                f.ctime.0,
                f.ctime.1,
                escape(f.path.as_os_str().as_bytes())
            );
        }
        s
    }

    /// The record as saved: its lines and their SHA-256.
    pub fn to_text(&self) -> String {
        let body = self.body();
        format!("{body}sha256 {}\n", sha256_hex(body.as_bytes()))
    }

    /// Parse a saved record; `Err` says why it is not one.
    pub fn parse(text: &[u8]) -> Result<Record, String> {
        let text = std::str::from_utf8(text).map_err(|_| "damaged: not text".to_string())?;
        let (body, sum) = text
            .strip_suffix('\n')
            .and_then(|t| t.rsplit_once('\n'))
            .ok_or("truncated")?;
        let body = format!("{body}\n");
        match sum.strip_prefix("sha256 ") {
            Some(hex) if hex == sha256_hex(body.as_bytes()) => {}
            _ => return Err("damaged: its digest does not match its contents".into()),
        }
        let mut lines = body.lines();
        if lines.next() != Some(MAGIC) {
            return Err(format!("not a '{MAGIC}' record"));
        }
        let size = lines
            .next()
            .and_then(|l| l.strip_prefix("size "))
            .and_then(|n| n.parse().ok())
            .ok_or("no size line")?;
        let mut record = Record {
            size,
            export: None,
            files: Vec::new(),
            http: Vec::new(),
        };
        for line in lines {
            match line.split_once(' ') {
                Some(("nbd", e)) if record.export.is_none() && record.files.is_empty() => {
                    record.export = Some(e.to_string())
                }
                Some(("file", f)) => record.files.push(parse_stamp(f)?),
                Some(("http", h)) => record.http.push(parse_remote(h)?),
                _ => return Err(format!("a line not understood: '{line}'")),
            }
        }
        Ok(record)
    }

    /// How the image as it is `now` differs from this record that `saved`
    /// ("the checkpoint") keeps, if it does: the first difference, naming
    /// the file or export.
    pub fn changed_since(&self, now: &Record, saved: &str) -> Option<String> {
        match (&self.export, &now.export) {
            (Some(a), Some(b)) if a != b => {
                return Some(format!(
                    "{saved} is of the export {}, not {}",
                    show_export(a),
                    show_export(b)
                ));
            }
            (Some(a), None) => return Some(format!("{saved} is of the export {}", show_export(a))),
            (None, Some(_)) => return Some(format!("{saved} is of an image file, not an export")),
            _ => {}
        }
        if let Some(why) = remote_changed(&self.http, &now.http, saved) {
            return Some(why);
        }
        if self.size != now.size {
            return Some(format!(
                "the image's size changed from {} to {} bytes",
                self.size, now.size
            ));
        }
        // The image itself, by what it is (the name may differ: a link, a
        // file moved), then the files it reads, by name.
        let (top, rest) = self
            .files
            .split_first()
            .map_or((None, &[][..]), |(t, r)| (Some(t), r));
        let (now_top, now_rest) = now
            .files
            .split_first()
            .map_or((None, &[][..]), |(t, r)| (Some(t), r));
        match (top, now_top) {
            (Some(a), Some(b)) => {
                if let Some(why) = a.changed(b, "it", saved) {
                    return Some(why);
                }
            }
            (None, None) => {}
            _ => {
                return Some(format!(
                    "it is another kind of image than {saved} was saved for"
                ));
            }
        }
        for f in rest {
            match now_rest.iter().find(|n| n.path == f.path) {
                None => {
                    return Some(format!(
                        "the image no longer reads {} (a backing, data or extent file when {saved} was saved)",
                        f.path.display()
                    ));
                }
                Some(n) => {
                    if let Some(why) = f.changed(n, &f.path.display().to_string(), saved) {
                        return Some(why);
                    }
                }
            }
        }
        if let Some(n) = now_rest
            .iter()
            .find(|n| !rest.iter().any(|f| f.path == n.path))
        {
            return Some(format!(
                "the image now reads {}, which it did not when {saved} was saved",
                n.path.display()
            ));
        }
        None
    }
}

impl Record {
    /// The first file of this record that `now` says was written, replaced
    /// or removed since (a file `now` reads and this did not counts too).
    pub fn first_changed<'a>(&'a self, now: &'a Record) -> Option<&'a Path> {
        let same = |a: &Stamp, b: &Stamp| a.changed(b, "", "").is_none();
        for f in &self.files {
            match now.files.iter().find(|n| n.path == f.path) {
                Some(n) if same(f, n) => {}
                _ => return Some(&f.path),
            }
        }
        now.files
            .iter()
            .find(|n| !self.files.iter().any(|f| f.path == n.path))
            .map(|n| n.path.as_path())
    }
}

/// An export's line: where it is, TLS or not, and its name.
fn export_of(url: &str) -> io::Result<String> {
    use blkimage::nbd::{Address, NbdUrl};
    let u = NbdUrl::parse(url)?;
    let at = match &u.address {
        Address::Tcp { host, port } => format!("tcp {}:{port}", escape(host.as_bytes())),
        Address::Unix(p) => format!("unix {}", escape(p.as_os_str().as_bytes())),
    };
    let tls = if u.tls { "tls" } else { "plain" };
    Ok(format!("{at} {tls} {}", escape(u.export.as_bytes())))
}

/// An export's line as people read it: "tcp host:10809, export 'disk'".
fn show_export(line: &str) -> String {
    let f: Vec<&str> = line.split(' ').collect();
    match f.as_slice() {
        [kind, at, _tls, export] => {
            let at = unescape(at).map(|b| String::from_utf8_lossy(&b).into_owned());
            let export = unescape(export).map(|b| String::from_utf8_lossy(&b).into_owned());
            format!(
                "'{}' at {kind} {}",
                export.unwrap_or_default(),
                at.unwrap_or_default()
            )
        }
        _ => line.to_string(),
    }
}

/// How the files read over HTTP(S) differ from those recorded, if they do:
/// another URL, or another version (length, ETag, Last-Modified).
fn remote_changed(
    then: &[blkimage::http::RemoteFile],
    now: &[blkimage::http::RemoteFile],
    saved: &str,
) -> Option<String> {
    for (i, t) in then.iter().enumerate() {
        let Some(n) = now.get(i) else {
            return Some(format!("the image no longer reads {} over HTTP", t.url));
        };
        if t.url != n.url {
            return Some(format!("{saved} is of {}, not {}", t.url, n.url));
        }
        let shown = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".into());
        let why = if t.size != n.size {
            format!(
                "its length is {} bytes, {saved} recorded {}",
                n.size, t.size
            )
        } else if t.etag != n.etag {
            format!(
                "its ETag is {}, {saved} recorded {}",
                shown(&n.etag),
                shown(&t.etag)
            )
        } else if t.last_modified != n.last_modified {
            format!(
                "it was last modified {}, {saved} recorded {}",
                shown(&n.last_modified),
                shown(&t.last_modified)
            )
        } else {
            continue;
        };
        return Some(format!(
            "{} is another version than {saved} was saved for: {why}",
            t.url
        ));
    }
    now.get(then.len()).map(|n| {
        format!(
            "the image now reads {} over HTTP, which it did not when {saved} was saved",
            n.url
        )
    })
}

fn parse_remote(line: &str) -> Result<blkimage::http::RemoteFile, String> {
    let f: Vec<&str> = line.split(' ').collect();
    let [url, size, etag, date] = f.as_slice() else {
        return Err(format!("an http line not understood: '{line}'"));
    };
    let text = |v: &str| -> Result<String, String> {
        let b = unescape(v).ok_or_else(|| format!("bad escape in '{v}'"))?;
        String::from_utf8(b).map_err(|_| format!("not UTF-8: '{v}'"))
    };
    let word = |v: &str| match v {
        "-" => Ok(None),
        v => text(v).map(Some),
    };
    Ok(blkimage::http::RemoteFile {
        url: text(url)?,
        size: size.parse().map_err(|_| format!("bad number '{size}'"))?,
        etag: word(etag)?,
        last_modified: word(date)?,
    })
}

fn parse_stamp(line: &str) -> Result<Stamp, String> {
    let f: Vec<&str> = line.split(' ').collect();
    let [kind, dev, ino, rdev, size, mtime, ctime, path] = f.as_slice() else {
        return Err(format!("a file line not understood: '{line}'"));
    };
    let num = |v: &str| v.parse::<u64>().map_err(|_| format!("bad number '{v}'"));
    let time = |v: &str| -> Result<(i64, i64), String> {
        let bad = || format!("bad time '{v}'");
        let (s, ns) = v.split_once('.').ok_or_else(bad)?;
        Ok((
            s.parse().map_err(|_| bad())?,
            ns.parse().map_err(|_| bad())?,
        ))
    };
    let block = match *kind {
        "file" => false,
        "block" => true,
        k => return Err(format!("a file of kind '{k}'")),
    };
    let path = unescape(path).ok_or_else(|| format!("bad escape in '{path}'"))?;
    Ok(Stamp {
        path: PathBuf::from(OsStr::from_bytes(&path)),
        block,
        dev: num(dev)?,
        ino: num(ino)?,
        rdev: num(rdev)?,
        size: num(size)?,
        mtime: time(mtime)?,
        ctime: time(ctime)?,
    })
}

/// Bytes as a word of printable ASCII: `%XX` for `%` and any byte outside
/// `!`..`~` (space and newline included).
fn escape(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    for &c in b {
        if c.is_ascii_graphic() && c != b'%' {
            s.push(c as char);
        } else {
            s += &format!("%{c:02X}");
        }
    }
    s
}

fn unescape(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            out.push(u8::from_str_radix(s.get(i + 1..i + 3)?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// A file time as people read it: `2026-11-23T22:15:07.123456789Z` (UTC).
fn when((secs, nanos): (i64, i64)) -> String {
    match u64::try_from(secs) {
        Ok(s) => humantime::format_rfc3339_nanos(
            std::time::UNIX_EPOCH + std::time::Duration::new(s, nanos.clamp(0, 999_999_999) as u32),
        )
        .to_string(),
        Err(_) => format!("{secs}.{nanos:09} s since 1970"),
    }
}

fn sha256_hex(data: &[u8]) -> String {
    let mut d = [0u8; 32];
    Algorithm::Sha256.digest_into(data, &mut d);
    to_hex(&d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(path: &str) -> Stamp {
        Stamp {
            path: PathBuf::from(OsStr::from_bytes(path.as_bytes())),
            block: false,
            dev: 1,
            ino: 2,
            rdev: 0,
            size: 4096,
            mtime: (5, 6),
            ctime: (7, 8),
        }
    }

    #[test]
    fn round_trip_damage_and_names_of_any_bytes() {
        let r = Record {
            size: 1 << 30,
            export: None,
            files: vec![stamp("/a b/over lay.qcow2"), stamp("/x/100%\n\u{e9}.raw")],
            http: vec![],
        };
        let t = r.to_text();
        assert_eq!(Record::parse(t.as_bytes()), Ok(r.clone()));
        let bad = t.replace("size 1073741824", "size 1073741825");
        assert!(
            Record::parse(bad.as_bytes())
                .unwrap_err()
                .contains("damaged")
        );
        assert!(Record::parse(&t.as_bytes()[..t.len() / 2]).is_err());
        assert!(Record::parse(b"").is_err());
        let e = Record {
            size: 5,
            export: Some(export_of("nbd+unix:///disk?socket=/run/s").unwrap()),
            files: vec![],
            http: vec![],
        };
        assert_eq!(Record::parse(e.to_text().as_bytes()), Ok(e));
    }

    #[test]
    fn every_difference_is_named() {
        let then = Record {
            size: 100,
            export: None,
            files: vec![stamp("/top"), stamp("/base")],
            http: vec![],
        };
        let same = then.clone();
        assert_eq!(then.changed_since(&same, "the checkpoint"), None);
        let mut base_written = then.clone();
        base_written.files[1].mtime = (9, 0);
        let why = then.changed_since(&base_written, "the checkpoint").unwrap();
        assert!(
            why.starts_with("/base was written after the checkpoint"),
            "{why}"
        );
        let mut rebased = then.clone();
        rebased.files[1] = stamp("/other");
        let why = then.changed_since(&rebased, "the checkpoint").unwrap();
        assert!(why.contains("no longer reads /base"), "{why}");
        let mut replaced = then.clone();
        replaced.files[0].ino = 3;
        let why = then.changed_since(&replaced, "the checkpoint").unwrap();
        assert!(why.contains("it is another file or device"), "{why}");
        let mut moved = then.clone();
        moved.files[0].path = "/moved".into();
        assert_eq!(then.changed_since(&moved, "the checkpoint"), None);
        let mut written = then.clone();
        written.files[0].ctime = (9, 0);
        let why = then.changed_since(&written, "the checkpoint").unwrap();
        assert!(
            why.starts_with("it was written after the checkpoint was saved (its change time"),
            "{why}"
        );
        let mut more = then.clone();
        more.files.push(stamp("/data"));
        let why = then.changed_since(&more, "the checkpoint").unwrap();
        assert!(why.contains("now reads /data"), "{why}");
        let a = Record {
            size: 100,
            export: Some(export_of("nbd://h:1/a").unwrap()),
            files: vec![],
            http: vec![],
        };
        let b = Record {
            export: Some(export_of("nbd://h:1/b").unwrap()),
            ..a.clone()
        };
        let why = a.changed_since(&b, "the checkpoint").unwrap();
        assert!(
            why.contains("export 'a' at tcp h:1, not 'b' at tcp h:1"),
            "{why}"
        );
    }

    #[test]
    fn files_over_http_by_url_and_version() {
        let remote = |url: &str, etag: Option<&str>| blkimage::http::RemoteFile {
            url: url.into(),
            size: 1 << 20,
            etag: etag.map(String::from),
            last_modified: Some("Mon, 01 Jan 2024 00:00:00 GMT".into()),
        };
        let then = Record {
            size: 1 << 20,
            export: None,
            files: vec![],
            http: vec![
                remote("https://h/top.qcow2", Some("\"a b\"")),
                remote("https://h/base.raw", None),
            ],
        };
        assert_eq!(Record::parse(then.to_text().as_bytes()), Ok(then.clone()));
        assert_eq!(then.changed_since(&then.clone(), "the checkpoint"), None);
        let mut other = then.clone();
        other.http[1].etag = Some("\"b\"".into());
        let why = then.changed_since(&other, "the checkpoint").unwrap();
        assert!(
            why.contains("https://h/base.raw is another version") && why.contains("ETag"),
            "{why}"
        );
        let mut moved = then.clone();
        moved.http[0].url = "https://h/other.qcow2".into();
        let why = then.changed_since(&moved, "the checkpoint").unwrap();
        assert!(why.contains("not https://h/other.qcow2"), "{why}");
        let mut longer = then.clone();
        longer.http[0].size += 1;
        assert!(then.changed_since(&longer, "the checkpoint").is_some());
        let file = Record {
            http: vec![],
            files: vec![stamp("/top")],
            ..then.clone()
        };
        assert!(then.changed_since(&file, "the checkpoint").is_some());
        assert!(file.changed_since(&then, "the checkpoint").is_some());
    }
}
