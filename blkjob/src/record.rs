//! The record of what an image is, kept by whatever later trusts its
//! digests instead of reading again: a checkpoint (to refuse resuming
//! into a checksum of another image, or of this one changed since), a map
//! (to refuse an incremental update when a file the image reads changed
//! behind its dirty bitmap), and blksync's side record of DST (to tell a
//! DST written behind the state's back). One format, one check.
//!
//! An image is more than the file named: a qcow2 overlay reads its backing
//! chain and its external data file, a vmdk its extents. The record holds
//! every file the image reads (as [`blkimage::Source::files`] lists them,
//! by canonical path) with what tells that it changed: device, inode, size,
//! modification and change times. An NBD export has no file to look at:
//! the record holds its address and export name (the URL has no secret in
//! it: TLS keys are files named by path), and resuming also compares
//! sampled data blocks; what a checkpoint of an export can and cannot prove
//! is said in docs/guide/parts.md ("Resume"). A file read over HTTP(S)
//! (the image, its backing and data files) is recorded by its URL (without
//! user, password or query: a presigned URL's signature changes when it is
//! signed again, the file does not), its length, and the validators its
//! server gave (ETag, Last-Modified): another version of the file differs
//! in one of them.
//!
//! The record is text, a field per line, signed with its SHA-256:
//!
//! ```text
//! blkhash-input 1
//! size <the image's guest size in bytes>
//! map <the checksum of the map it belongs to, hex>                  (a side record)
//! nbd <tcp HOST:PORT | unix SOCKET> <tls|plain> <export name>      (an export)
//! http <url> <size> <etag|-> <last-modified|->           (each file read over HTTP)
//! file <file|block> <dev> <ino> <rdev> <size> <mtime> <ctime> <path>  (each file read)
//! data <file|block> <dev> <ino> <rdev> <size> <mtime> <ctime> <path>  (the same, for the
//!                                       image's external data file: its writes are the image's)
//! sha256 <SHA-256 of the lines above, hex>
//! ```
//!
//! Names are percent-escaped (any byte outside `!`..`~`, and `%`), so that
//! a line splits on spaces and any file name survives. The older side
//! record of blksync (`blksync-dst 1`, one field per line) is still read
//! ([`Record::parse_side`]).

use blkhash::{Algorithm, to_hex};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The first line of every record.
pub const MAGIC: &str = "blkhash-input 1";

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
    /// The file holds the image's own guest data besides the image file
    /// (its external data file): QEMU writes it with the image, and the
    /// image's dirty bitmaps record those writes (a backing file's are
    /// never recorded).
    pub own_data: bool,
}

impl Stamp {
    /// The stamp of the file at `path` as it is now.
    pub fn of(path: &Path) -> io::Result<Stamp> {
        let path = std::fs::canonicalize(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let m = std::fs::metadata(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(Stamp::of_meta(path, &m))
    }

    /// The stamp of the file at `path` whose metadata is `m` (a file kept
    /// open: its metadata, whatever its name now leads to).
    pub fn of_meta(path: PathBuf, m: &std::fs::Metadata) -> Stamp {
        let block = m.file_type().is_block_device();
        Stamp {
            block,
            dev: m.dev(),
            ino: m.ino(),
            rdev: m.rdev(),
            size: if block { 0 } else { m.len() },
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            own_data: false,
            path,
        }
    }

    /// Whether `now` is the same file or device: a file by its device and
    /// inode, a block device by its device number (a device node made
    /// again, as udev does at each boot, is the same device).
    fn same_node(&self, now: &Stamp) -> bool {
        self.block == now.block
            && match self.block {
                true => self.rdev == now.rdev,
                false => (self.dev, self.ino) == (now.dev, now.ino),
            }
    }

    /// How the file changed between this stamp and `now`, if it did; `it`
    /// is how the message calls the file.
    fn changed(&self, now: &Stamp, it: &str, saved: &str) -> Option<String> {
        if !self.same_node(now) {
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
                "{it} changed after {saved} was saved (its times: its {what} time is {}, {saved} recorded {})",
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
    /// For a side record, the checksum (hex) of the map whose target it
    /// describes: a record bound to another map is stale.
    pub map: Option<String>,
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
        let backing: Vec<PathBuf> = (src.backing_files().iter())
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .collect();
        let mut files = src
            .files()
            .iter()
            .map(|p| Stamp::of(p))
            .collect::<io::Result<Vec<_>>>()?;
        for f in files.iter_mut().skip(1) {
            f.own_data = !backing.contains(&f.path);
        }
        Ok(Record {
            size: src.size(),
            map: None,
            export,
            files,
            http: src.remote_files(),
        })
    }

    /// The side record of blksync's DST, the file at `path` (`meta`, its
    /// metadata; `size` bytes), as the map with checksum `map` describes it.
    pub fn of_target(map: String, path: &Path, meta: &std::fs::Metadata, size: u64) -> Record {
        Record {
            size,
            map: Some(map),
            export: None,
            files: vec![Stamp::of_meta(path.to_path_buf(), meta)],
            http: Vec::new(),
        }
    }

    fn body(&self) -> String {
        let mut s = format!("{MAGIC}\nsize {}\n", self.size);
        if let Some(m) = &self.map {
            s += &format!("map {m}\n");
        }
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
                "{} {} {} {} {} {} {}.{:09} {}.{:09} {}\n",
                if f.own_data { "data" } else { "file" },
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

    /// The record as a map carries it ([`blkmap::Map::identity`]), or
    /// none when it is over the bound a map holds
    /// ([`blkmap::MAX_IDENTITY`]: a backing chain of many hundreds of
    /// files), which leaves that map without a record rather than without
    /// a map.
    pub fn identity(&self) -> Option<Vec<u8>> {
        Some(self.to_text().into_bytes()).filter(|t| t.len() <= blkmap::MAX_IDENTITY)
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
            map: None,
            export: None,
            files: Vec::new(),
            http: Vec::new(),
        };
        for line in lines {
            match line.split_once(' ') {
                Some(("map", m))
                    if record.map.is_none()
                        && record.export.is_none()
                        && record.files.is_empty()
                        && !m.is_empty()
                        && m.bytes().all(|b| b.is_ascii_hexdigit()) =>
                {
                    record.map = Some(m.to_string())
                }
                Some(("nbd", e)) if record.export.is_none() && record.files.is_empty() => {
                    record.export = Some(e.to_string())
                }
                Some(("file", f)) => record.files.push(parse_stamp(f)?),
                Some(("http", h)) => record.http.push(parse_remote(h)?),
                Some(("data", f)) if !record.files.is_empty() => {
                    let mut stamp = parse_stamp(f)?;
                    stamp.own_data = true;
                    record.files.push(stamp);
                }
                _ => return Err(format!("a line not understood: '{line}'")),
            }
        }
        Ok(record)
    }

    /// How the image as it is `now` differs from this record that `saved`
    /// ("the checkpoint") keeps, if it does: the first difference, naming
    /// the file or export.
    pub fn changed_since(&self, now: &Record, saved: &str) -> Option<String> {
        if let Some(why) = self.export_changed(now, saved) {
            return Some(why);
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
        match (self.files.first(), now.files.first()) {
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
        self.files_changed(now, saved, false)
    }

    /// How the files the image reads besides itself (its backing chain,
    /// its external data file, a vmdk's extents) differ `now` from this
    /// record that `saved` ("OLD") keeps, if they do, or the export is
    /// another: what a dirty bitmap of the image cannot see, since it
    /// records writes to the image that holds it only. The image itself
    /// may have changed in any way (its bitmap says where). A side that
    /// cannot list its files (an export) against one that reads files
    /// besides the image is a difference too: they cannot be checked.
    pub fn below_image_changed(&self, now: &Record, saved: &str) -> Option<String> {
        // Files over HTTP are read-only here and carry no bitmap: any
        // other version of any of them is a change.
        if let Some(why) = remote_changed(&self.http, &now.http, saved) {
            return Some(why);
        }
        self.files_changed(now, saved, true)
    }

    /// How the files after the image itself differ `now`, or the export;
    /// an external data file may hold QEMU's writes (`qemu_writes`: the
    /// image's bitmaps recorded them) or must be unchanged.
    fn files_changed(&self, now: &Record, saved: &str, qemu_writes: bool) -> Option<String> {
        let rest = |r: &Record| r.files.get(1..).unwrap_or(&[]).to_vec();
        let (rest, now_rest) = (rest(self), rest(now));
        match (&self.export, &now.export) {
            (Some(_), Some(_)) => return self.export_changed(now, saved),
            (None, Some(e)) => {
                return rest.first().map(|f| {
                    format!(
                        "{saved} was made from an image that reads {} besides itself, and the \
                         export {} cannot show whether that file changed",
                        f.path.display(),
                        show_export(e)
                    )
                });
            }
            (Some(e), None) => {
                return now_rest.first().map(|f| {
                    format!(
                        "the image reads {} besides itself, and {saved} was made from the \
                         export {}, which cannot show whether that file changed since",
                        f.path.display(),
                        show_export(e)
                    )
                });
            }
            (None, None) => {}
        }
        for f in &rest {
            match now_rest.iter().find(|n| n.path == f.path) {
                None => {
                    return Some(format!(
                        "the image no longer reads {} (a backing, data or extent file when {saved} was saved)",
                        f.path.display()
                    ));
                }
                Some(n) if qemu_writes && f.own_data && n.own_data => {
                    if let Some(why) = data_changed(f, n, now.files.first(), saved) {
                        return Some(why);
                    }
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

    /// Whether this record and `now` are of other exports, or one of an
    /// export and the other of an image file.
    fn export_changed(&self, now: &Record, saved: &str) -> Option<String> {
        match (&self.export, &now.export) {
            (Some(a), Some(b)) if a != b => Some(format!(
                "{saved} is of the export {}, not {}",
                show_export(a),
                show_export(b)
            )),
            (Some(a), None) => Some(format!("{saved} is of the export {}", show_export(a))),
            (None, Some(_)) => Some(format!("{saved} is of an image file, not an export")),
            _ => None,
        }
    }

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

    /// Parse a side record of blksync's DST: this format, or the one
    /// versions before it wrote (`blksync-dst 1`, a field per line).
    pub fn parse_side(text: &[u8]) -> Result<Record, String> {
        if text.starts_with(LEGACY_SIDE.as_bytes()) {
            return parse_legacy_side(text);
        }
        Record::parse(text)
    }
}

/// How the image's external data file `then` changed into `now` in a way
/// its dirty bitmaps cannot record, if it did. QEMU writes the image's
/// guest data there and records it in the bitmaps, so new contents and
/// times are expected; but QEMU writes the image file last (it stores the
/// bitmaps and clears their in-use flag when it closes the image), so a
/// data file written after the image file (`image`: its stamp now) was
/// written by something else. Another file is never the image's data.
fn data_changed(then: &Stamp, now: &Stamp, image: Option<&Stamp>, saved: &str) -> Option<String> {
    let it = then.path.display().to_string();
    if !then.same_node(now) {
        return Some(format!(
            "{it} (the image's data file) is another file or device than the one {saved} was saved for"
        ));
    }
    let image_written = image.map_or((i64::MAX, 0), |i| i.mtime);
    if !now.block && now.mtime > image_written {
        return Some(format!(
            "{it} (the image's data file) was written after QEMU last wrote the image (its \
             modification time is {}, the image's {}): not by QEMU, whose writes the bitmap records",
            when(now.mtime),
            when(image_written)
        ));
    }
    None
}

/// The first line of the side record blksync wrote before this format.
const LEGACY_SIDE: &str = "blksync-dst 1\n";

/// A `blksync-dst 1` side record: a field per line (checksum, kind, dev,
/// ino, rdev, size, mtime, ctime), then its SHA-256; no path (DST's name
/// is not compared).
fn parse_legacy_side(text: &[u8]) -> Result<Record, String> {
    let text = std::str::from_utf8(text).map_err(|_| "damaged: not text".to_string())?;
    let (body, sum) = text
        .trim_end_matches('\n')
        .rsplit_once('\n')
        .ok_or("truncated")?;
    let body = format!("{body}\n");
    match sum.strip_prefix("sha256 ") {
        Some(hex) if hex == sha256_hex(body.as_bytes()) => {}
        _ => return Err("damaged: its digest does not match its contents".into()),
    }
    let mut lines = body.lines().skip(1);
    let mut field = |name: &str| -> Result<&str, String> {
        lines
            .next()
            .and_then(|l| l.strip_prefix(name))
            .and_then(|l| l.strip_prefix(' '))
            .ok_or_else(|| format!("no '{name}' line"))
    };
    let map = field("checksum")?.to_string();
    let kind = field("kind")?;
    let rest: Vec<&str> = ["dev", "ino", "rdev", "size", "mtime", "ctime"]
        .iter()
        .map(|n| field(n))
        .collect::<Result<_, _>>()?;
    let block = match kind {
        "file" => "file",
        "block" => "block",
        k => return Err(format!("a target of kind '{k}'")),
    };
    let size: u64 = rest[3]
        .parse()
        .map_err(|_| format!("bad number '{}'", rest[3]))?;
    let line = format!("{block} {} -", rest.join(" "));
    let mut stamp = parse_stamp(&line)?;
    stamp.path = PathBuf::new();
    if stamp.block {
        stamp.size = 0;
    }
    Ok(Record {
        size,
        map: Some(map),
        export: None,
        files: vec![stamp],
        http: Vec::new(),
    })
}

/// An export's line: where it is, TLS or not, and its name.
fn export_of(url: &str) -> io::Result<String> {
    use blkimage::nbd::{Address, NbdUrl};
    let u = NbdUrl::parse(url)?;
    let at = match &u.address {
        Address::Tcp { host, port } => format!("tcp {}:{port}", escape(host.as_bytes())),
        // One socket however it is written: `socket=nbd.sock` from the
        // socket's directory is the export `socket=/run/x/nbd.sock` was.
        Address::Unix(p) => {
            let p = std::path::absolute(p).unwrap_or_else(|_| p.clone());
            format!("unix {}", escape(p.as_os_str().as_bytes()))
        }
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
        own_data: false,
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
            own_data: false,
        }
    }

    #[test]
    fn round_trip_damage_and_names_of_any_bytes() {
        let r = Record {
            size: 1 << 30,
            map: None,
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
            map: None,
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
            map: None,
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
            why.starts_with("/base changed after the checkpoint"),
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
            why.starts_with(
                "it changed after the checkpoint was saved (its times: its change time"
            ),
            "{why}"
        );
        let mut more = then.clone();
        more.files.push(stamp("/data"));
        let why = then.changed_since(&more, "the checkpoint").unwrap();
        assert!(why.contains("now reads /data"), "{why}");
        let a = Record {
            size: 100,
            map: None,
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
    fn below_the_image_only_files_and_exports_count() {
        let then = Record {
            size: 100,
            map: None,
            export: None,
            files: vec![stamp("/top"), stamp("/base")],
            http: vec![],
        };
        // The image itself written, moved or replaced: its bitmap's business.
        let mut top = then.clone();
        top.files[0].mtime = (9, 0);
        top.files[0].ino = 77;
        assert_eq!(then.below_image_changed(&top, "OLD"), None);
        let mut written = then.clone();
        written.files[1].ctime = (9, 0);
        let why = then.below_image_changed(&written, "OLD").unwrap();
        assert!(why.starts_with("/base changed after OLD"), "{why}");
        let mut rebased = then.clone();
        rebased.files[1] = stamp("/other");
        let why = then.below_image_changed(&rebased, "OLD").unwrap();
        assert!(why.contains("no longer reads /base"), "{why}");
        let mut device = then.clone();
        device.files[1].block = true;
        let why = then.below_image_changed(&device, "OLD").unwrap();
        assert!(why.contains("another file or device"), "{why}");
        // An export cannot show the files below an image.
        let export = Record {
            size: 100,
            map: None,
            export: Some(export_of("nbd+unix:///top?socket=/s").unwrap()),
            files: vec![],
            http: vec![],
        };
        let why = then.below_image_changed(&export, "OLD").unwrap();
        assert!(why.contains("reads /base besides itself"), "{why}");
        let why = export.below_image_changed(&then, "OLD").unwrap();
        assert!(why.contains("made from the export 'top'"), "{why}");
        // An image alone, against an export of it: nothing to check below.
        let alone = Record {
            files: vec![stamp("/top")],
            ..then.clone()
        };
        assert_eq!(alone.below_image_changed(&export, "OLD"), None);
        assert_eq!(export.below_image_changed(&alone, "OLD"), None);
        let other = Record {
            export: Some(export_of("nbd+unix:///other?socket=/s").unwrap()),
            ..export.clone()
        };
        let why = export.below_image_changed(&other, "OLD").unwrap();
        assert!(
            why.contains("export 'top' at unix /s, not 'other'"),
            "{why}"
        );
    }

    #[test]
    fn a_socket_is_one_export_however_it_is_named() {
        let cwd = std::env::current_dir().unwrap();
        let full = export_of(&format!("nbd+unix:///d?socket={}/nbd.sock", cwd.display())).unwrap();
        assert_eq!(export_of("nbd+unix:///d?socket=nbd.sock").unwrap(), full);
        assert_eq!(export_of("nbd+unix:///d?socket=./nbd.sock").unwrap(), full);
        assert!(full.starts_with("unix /"), "{full}");
    }

    #[test]
    fn block_devices_by_device_number() {
        let mut a = stamp("/dev/sdb");
        a.block = true;
        a.rdev = 0x810;
        a.size = 0;
        let mut again = a.clone();
        // The node made again (another inode), the device the same.
        again.ino = 99;
        again.mtime = (1, 1);
        assert_eq!(a.changed(&again, "it", "OLD"), None);
        again.rdev = 0x820;
        assert!(a.changed(&again, "it", "OLD").is_some());
    }

    #[test]
    fn side_records_old_and_new() {
        let r = Record {
            size: 4096,
            map: Some("ab12".into()),
            export: None,
            files: vec![stamp("/dst raw")],
            http: vec![],
        };
        let t = r.to_text();
        assert_eq!(Record::parse_side(t.as_bytes()), Ok(r.clone()));
        assert!(Record::parse(b"blkhash-input 1\nsize 1\nmap zz\nsha256 0\n").is_err());
        // Written by earlier versions: the same identity, without a path.
        let body = "blksync-dst 1\nchecksum ab12\nkind file\ndev 1\nino 2\nrdev 0\n\
                    size 4096\nmtime 5.000000006\nctime 7.000000008\n";
        let old = format!("{body}sha256 {}\n", sha256_hex(body.as_bytes()));
        let legacy = Record::parse_side(old.as_bytes()).unwrap();
        assert_eq!(legacy.map.as_deref(), Some("ab12"));
        assert_eq!(legacy.size, 4096);
        assert_eq!(r.changed_since(&legacy, "the state"), None);
        let damaged = old.replace("ino 2", "ino 3");
        assert!(
            Record::parse_side(damaged.as_bytes())
                .unwrap_err()
                .contains("damaged")
        );
    }

    #[test]
    fn a_data_file_may_hold_qemus_writes_only() {
        let mut data = stamp("/d.raw");
        data.own_data = true;
        let then = Record {
            size: 100,
            map: None,
            export: None,
            files: vec![stamp("/img.qcow2"), data.clone()],
            http: vec![],
        };
        let t = then.to_text();
        assert!(t.contains("\ndata file "), "{t}");
        assert_eq!(Record::parse(t.as_bytes()), Ok(then.clone()));
        // QEMU wrote the data, then the image (its bitmaps) on closing.
        let mut qemu = then.clone();
        qemu.files[1].mtime = (20, 0);
        qemu.files[1].ctime = (20, 0);
        qemu.files[0].mtime = (21, 0);
        assert_eq!(then.below_image_changed(&qemu, "OLD"), None);
        // Written after QEMU last closed the image: not QEMU.
        let mut dd = qemu.clone();
        dd.files[1].mtime = (30, 0);
        let why = then.below_image_changed(&dd, "OLD").unwrap();
        assert!(
            why.contains("/d.raw (the image's data file) was written after QEMU"),
            "{why}"
        );
        let mut swapped = qemu.clone();
        swapped.files[1].ino = 50;
        let why = then.below_image_changed(&swapped, "OLD").unwrap();
        assert!(why.contains("another file"), "{why}");
        // A checkpoint takes no change at all, of the data file alone too.
        let mut touched = then.clone();
        touched.files[1].ctime = (9, 0);
        assert_eq!(then.below_image_changed(&touched, "OLD"), None);
        let why = then.changed_since(&touched, "the checkpoint").unwrap();
        assert!(why.starts_with("/d.raw changed after"), "{why}");
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
            map: None,
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
