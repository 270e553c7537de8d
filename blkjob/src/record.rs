//! The record of what an image is, kept by whatever later trusts its
//! digests instead of reading again: a checkpoint (to refuse resuming
//! into a checksum of another image, or of this one changed since), a map
//! (to refuse an incremental update when a file the image reads changed
//! behind its dirty bitmap), and blksync's side record of DST (to tell a
//! DST written behind the state's back). One format, one check.
//!
//! An image is more than the file named: a qcow2 overlay reads its backing
//! chain and its external data file, a vmdk its extents. The record holds
//! every file the image reads (as [`blkimage::Source::origin`] lists them,
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
//! The record asks the image where its bytes come from
//! ([`blkimage::Source::origin`]) and parses no name: files of this host
//! are stamped here, and anything else (an export, a file over HTTP) is
//! kept as the words its source gives ([`blkimage::Remote`]), so a new
//! transport needs no change here.
//!
//! The record is text, a field per line, signed with its SHA-256:
//!
//! ```text
//! blkhash-input 1
//! size <the image's guest size in bytes>
//! map <the checksum of the map it belongs to, hex>                  (a side record)
//! nbd <tcp HOST:PORT | unix SOCKET> <tls|plain> <export name>      (an export)
//! http <url> <size> <etag|-> <last-modified|->           (each file read over HTTP)
//! <kind> <word>...                         (what another transport reads: its words)
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
use blkimage::{Origin, Remote, Role};
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
#[derive(Clone, Debug)]
pub struct Record {
    /// The guest size in bytes.
    pub size: u64,
    /// For a side record, the checksum (hex) of the map whose target it
    /// describes: a record bound to another map is stale.
    pub map: Option<String>,
    /// What the image reads from elsewhere than this host's files (an
    /// NBD export; files over HTTP(S)), in the order it opened them. One
    /// parsed from a saved record has no labels: its words are all in
    /// `version`, each labelled "".
    pub remote: Vec<Remote>,
    /// The files read, in the order the image opened them.
    pub files: Vec<Stamp>,
}

/// Records are equal if they say the same: a remote origin by its words,
/// whatever labels it has (a parsed one has none).
impl PartialEq for Record {
    fn eq(&self, other: &Record) -> bool {
        let words = |r: &Record| -> Vec<(String, Vec<Option<String>>)> {
            (r.remote.iter())
                .map(|o| (o.kind.clone(), owned(o.words())))
                .collect()
        };
        (self.size, &self.map, &self.files) == (other.size, &other.map, &other.files)
            && words(self) == words(other)
    }
}

impl Eq for Record {}

fn owned(words: Vec<Option<&str>>) -> Vec<Option<String>> {
    words.into_iter().map(|w| w.map(str::to_string)).collect()
}

impl Record {
    /// The record of the image opened as `src`, from where it says its
    /// bytes come from ([`blkimage::Source::origin`]).
    pub fn of(src: &dyn blkimage::Source) -> io::Result<Record> {
        let mut record = Record {
            size: src.size(),
            map: None,
            remote: Vec::new(),
            files: Vec::new(),
        };
        for origin in src.origin() {
            match origin {
                Origin::File { path, role } => {
                    let mut stamp = Stamp::of(&path)?;
                    // The image itself is never "data": the first file is it.
                    stamp.own_data = role == Role::Data && !record.files.is_empty();
                    record.files.push(stamp);
                }
                Origin::Remote(r) => record.remote.push(r),
                _ => {}
            }
        }
        Ok(record)
    }

    /// The side record of blksync's DST, the file at `path` (`meta`, its
    /// metadata; `size` bytes), as the map with checksum `map` describes it.
    pub fn of_target(map: String, path: &Path, meta: &std::fs::Metadata, size: u64) -> Record {
        Record {
            size,
            map: Some(map),
            remote: Vec::new(),
            files: vec![Stamp::of_meta(path.to_path_buf(), meta)],
        }
    }

    fn body(&self) -> String {
        let mut s = format!("{MAGIC}\nsize {}\n", self.size);
        if let Some(m) = &self.map {
            s += &format!("map {m}\n");
        }
        for r in &self.remote {
            // "-" is no value; a value "-" is escaped.
            let word = |v: Option<&str>| match v {
                None => "-".to_string(),
                Some("-") => "%2D".to_string(),
                Some(v) => escape(v.as_bytes()),
            };
            let words: Vec<String> = r.words().into_iter().map(word).collect();
            s += &format!("{} {}\n", r.kind, words.join(" "));
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
            remote: Vec::new(),
            files: Vec::new(),
        };
        for line in lines {
            match line.split_once(' ') {
                Some(("map", m))
                    if record.map.is_none()
                        && record.remote.is_empty()
                        && record.files.is_empty()
                        && !m.is_empty()
                        && m.bytes().all(|b| b.is_ascii_hexdigit()) =>
                {
                    record.map = Some(m.to_string())
                }
                Some(("file", f)) => record.files.push(parse_stamp(f)?),
                Some(("data", f)) if !record.files.is_empty() => {
                    let mut stamp = parse_stamp(f)?;
                    stamp.own_data = true;
                    record.files.push(stamp);
                }
                Some((kind, words)) if is_kind(kind) => {
                    record.remote.push(parse_remote(kind, words)?)
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
        if let Some(why) = remote_changed(&self.remote, &now.remote, saved) {
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
        match (self.remote.first(), now.remote.first()) {
            // What is read from elsewhere is read-only here and carries no
            // bitmap: any other version of any of it is a change.
            (Some(_), Some(_)) | (None, None) => {
                if let Some(why) = remote_changed(&self.remote, &now.remote, saved) {
                    return Some(why);
                }
            }
            // An image read from elsewhere against one read from files: only
            // what each reads besides the image could differ, and the remote
            // side cannot show it.
            (Some(r), None) => {
                return now.files.get(1).map(|f| {
                    format!(
                        "the image reads {} besides itself, and {saved} was made from {}, \
                         which cannot show whether that file changed since",
                        f.path.display(),
                        show(r, &r.what, None)
                    )
                });
            }
            (None, Some(r)) => {
                return self.files.get(1).map(|f| {
                    format!(
                        "{saved} was made from an image that reads {} besides itself, and {} \
                         cannot show whether that file changed",
                        f.path.display(),
                        show(r, &r.what, None)
                    )
                });
            }
        }
        self.files_changed(now, saved, true)
    }

    /// Whether the image file itself is another file than the one this
    /// record that `saved` ("OLD") keeps was made from: another file
    /// renamed over its path, or a copy, whose dirty bitmaps say nothing of
    /// how it differs from the image recorded. By device and inode (a
    /// block device by its device number); the image's contents and times
    /// may have changed in any way (its bitmap says where).
    pub fn image_replaced(&self, now: &Record, saved: &str) -> Option<String> {
        let (then, now) = (self.files.first()?, now.files.first()?);
        (!then.same_node(now)).then(|| {
            format!(
                "the file at its path is not the one {saved} was made from (device {}, inode {} \
                 then; device {}, inode {} now): another file renamed over it, or a copy, whose \
                 dirty bitmaps cannot say what changed since",
                then.dev, then.ino, now.dev, now.ino
            )
        })
    }

    /// How the files after the image itself differ `now`; an external data
    /// file may hold QEMU's writes (`qemu_writes`: the image's bitmaps
    /// recorded them) or must be unchanged.
    fn files_changed(&self, now: &Record, saved: &str, qemu_writes: bool) -> Option<String> {
        let rest = |r: &Record| r.files.get(1..).unwrap_or(&[]).to_vec();
        let (rest, now_rest) = (rest(self), rest(now));
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
        remote: Vec::new(),
        files: vec![stamp],
    })
}

/// `r` as messages name it: "the export tcp host:10809 plain disk", "the
/// file https://...": what it is (`what`: its own, or that of the same
/// kind now, for one parsed from a saved record) and its name's words
/// (`named` of them when another record says how many; all of them for
/// one parsed), else its kind and words.
fn show(r: &Remote, what: &str, named: Option<usize>) -> String {
    let words = r.words();
    let n = named.unwrap_or(if r.name.is_empty() {
        words.len()
    } else {
        r.name.len()
    });
    let name: Vec<&str> = (words.iter().take(n)).map(|w| w.unwrap_or("-")).collect();
    match what {
        "" => format!("{} {}", r.kind, name.join(" ")),
        what => format!("the {what} {}", name.join(" ")),
    }
}

/// How what the image reads from elsewhere differs from what was
/// recorded, if it does: another thing (kind or name), or another version.
/// `now` is the image's own record (its origins say which words name it
/// and what each of the others is called); `then` may be parsed.
fn remote_changed(then: &[Remote], now: &[Remote], saved: &str) -> Option<String> {
    for (i, t) in then.iter().enumerate() {
        let Some(n) = now.get(i) else {
            return Some(format!(
                "the image no longer reads {}",
                show(t, &t.what, None)
            ));
        };
        let (tw, nw, named) = (t.words(), n.words(), n.name.len());
        if t.kind != n.kind {
            return Some(format!(
                "{saved} is of {}, not {}",
                show(t, &t.what, None),
                show(n, &n.what, None)
            ));
        }
        if tw.get(..named) != nw.get(..named) {
            return Some(format!(
                "{saved} is of {}, not {}",
                show(t, &n.what, Some(named)),
                show(n, &n.what, Some(named))
            ));
        }
        let Some(j) = (named..tw.len().max(nw.len())).find(|&j| tw.get(j) != nw.get(j)) else {
            continue;
        };
        let label = n
            .version
            .get(j - named)
            .map_or("version", |(l, _)| l.as_str());
        let value = |w: Option<&Option<&str>>| w.copied().flatten().unwrap_or("none").to_string();
        return Some(format!(
            "{} is another version than {saved} was saved for: its {label} is {}, {saved} \
             recorded {}",
            show(n, &n.what, Some(named)),
            value(nw.get(j)),
            value(tw.get(j))
        ));
    }
    now.get(then.len()).map(|n| {
        format!(
            "the image now reads {}, which it did not when {saved} was saved",
            show(n, &n.what, None)
        )
    })
}

/// Whether `word` can be the kind of a remote origin's line: a lowercase
/// word that is none of the record's own.
fn is_kind(word: &str) -> bool {
    !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && !["size", "map", "file", "data", "sha256"].contains(&word)
}

/// A remote origin's line after its kind: its words, as saved. Which of
/// them name it is the source's to say when the record is compared.
fn parse_remote(kind: &str, line: &str) -> Result<Remote, String> {
    let word = |v: &str| -> Result<(String, Option<String>), String> {
        if v == "-" {
            return Ok((String::new(), None));
        }
        let b = unescape(v).ok_or_else(|| format!("bad escape in '{v}'"))?;
        let text = String::from_utf8(b).map_err(|_| format!("not UTF-8: '{v}'"))?;
        Ok((String::new(), Some(text)))
    };
    Ok(Remote {
        kind: kind.to_string(),
        what: String::new(),
        name: Vec::new(),
        version: line.split(' ').map(word).collect::<Result<_, _>>()?,
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

    /// An export's origin as the NBD client gives it.
    fn export(url: &str) -> Remote {
        use blkimage::nbd::{Address, NbdUrl};
        let u = NbdUrl::parse(url).unwrap();
        let (kind, at) = match &u.address {
            Address::Tcp { host, port } => ("tcp", format!("{host}:{port}")),
            Address::Unix(p) => ("unix", p.display().to_string()),
        };
        let tls = if u.tls { "tls" } else { "plain" };
        Remote {
            kind: "nbd".into(),
            what: "export".into(),
            name: vec![kind.into(), at, tls.into(), u.export],
            version: vec![],
        }
    }

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
            remote: vec![],
            files: vec![stamp("/a b/over lay.qcow2"), stamp("/x/100%\n\u{e9}.raw")],
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
            remote: vec![export("nbd+unix:///disk?socket=/run/s")],
            files: vec![],
        };
        assert_eq!(Record::parse(e.to_text().as_bytes()), Ok(e));
    }

    #[test]
    fn every_difference_is_named() {
        let then = Record {
            size: 100,
            map: None,
            remote: vec![],
            files: vec![stamp("/top"), stamp("/base")],
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
            remote: vec![export("nbd://h:1/a")],
            files: vec![],
        };
        let b = Record {
            remote: vec![export("nbd://h:1/b")],
            ..a.clone()
        };
        let why = a.changed_since(&b, "the checkpoint").unwrap();
        assert!(
            why.contains("is of the export tcp h:1 plain a, not the export tcp h:1 plain b"),
            "{why}"
        );
    }

    #[test]
    fn below_the_image_only_files_and_exports_count() {
        let then = Record {
            size: 100,
            map: None,
            remote: vec![],
            files: vec![stamp("/top"), stamp("/base")],
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
            remote: vec![export("nbd+unix:///top?socket=/s")],
            files: vec![],
        };
        let why = then.below_image_changed(&export, "OLD").unwrap();
        assert!(why.contains("reads /base besides itself"), "{why}");
        let why = export.below_image_changed(&then, "OLD").unwrap();
        assert!(
            why.contains("made from the export unix /s plain top"),
            "{why}"
        );
        // An image alone, against an export of it: nothing to check below.
        let alone = Record {
            files: vec![stamp("/top")],
            ..then.clone()
        };
        assert_eq!(alone.below_image_changed(&export, "OLD"), None);
        assert_eq!(export.below_image_changed(&alone, "OLD"), None);
        let other = Record {
            remote: vec![super::tests::export("nbd+unix:///other?socket=/s")],
            ..export.clone()
        };
        let why = export.below_image_changed(&other, "OLD").unwrap();
        assert!(
            why.contains("is of the export unix /s plain top, not the export unix /s plain other"),
            "{why}"
        );
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
            remote: vec![],
            files: vec![stamp("/dst raw")],
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
            remote: vec![],
            files: vec![stamp("/img.qcow2"), data.clone()],
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
        let remote = |url: &str, etag: Option<&str>| Remote {
            kind: "http".into(),
            what: "file".into(),
            name: vec![url.into()],
            version: vec![
                ("length".into(), Some((1 << 20).to_string())),
                ("ETag".into(), etag.map(String::from)),
                (
                    "Last-Modified".into(),
                    Some("Mon, 01 Jan 2024 00:00:00 GMT".into()),
                ),
            ],
        };
        let then = Record {
            size: 1 << 20,
            map: None,
            remote: vec![
                remote("https://h/top.qcow2", Some("\"a b\"")),
                remote("https://h/base.raw", None),
            ],
            files: vec![],
        };
        assert_eq!(Record::parse(then.to_text().as_bytes()), Ok(then.clone()));
        assert_eq!(then.changed_since(&then.clone(), "the checkpoint"), None);
        let mut other = then.clone();
        other.remote[1].version[1].1 = Some("\"b\"".into());
        let why = then.changed_since(&other, "the checkpoint").unwrap();
        assert!(
            why.contains("https://h/base.raw is another version") && why.contains("ETag"),
            "{why}"
        );
        let mut moved = then.clone();
        moved.remote[0].name[0] = "https://h/other.qcow2".into();
        let why = then.changed_since(&moved, "the checkpoint").unwrap();
        assert!(why.contains("not the file https://h/other.qcow2"), "{why}");
        let mut longer = then.clone();
        longer.remote[0].version[0].1 = Some((1 << 21).to_string());
        assert!(then.changed_since(&longer, "the checkpoint").is_some());
        let file = Record {
            remote: vec![],
            files: vec![stamp("/top")],
            ..then.clone()
        };
        assert!(then.changed_since(&file, "the checkpoint").is_some());
        assert!(file.changed_since(&then, "the checkpoint").is_some());
    }

    /// Records written before origins were asked of the source (an `nbd`
    /// line of the export's URL, `http` lines of each file) still load,
    /// and compare equal to the record the same image gives now.
    #[test]
    fn records_of_earlier_versions_load() {
        let body = "blkhash-input 1\nsize 1048576\n\
                    nbd tcp h:10809 tls my%20disk\n";
        let text = format!("{body}sha256 {}\n", sha256_hex(body.as_bytes()));
        let then = Record::parse(text.as_bytes()).unwrap();
        let now = Record {
            size: 1 << 20,
            map: None,
            remote: vec![export("nbds://h:10809/my%20disk")],
            files: vec![],
        };
        assert_eq!(then, now);
        assert_eq!(then.changed_since(&now, "the checkpoint"), None);
        assert_eq!(now.to_text(), text);
        let body = "blkhash-input 1\nsize 1048576\n\
                    http https://h/d.raw 1048576 \"e\" -\n";
        let text = format!("{body}sha256 {}\n", sha256_hex(body.as_bytes()));
        let then = Record::parse(text.as_bytes()).unwrap();
        let now = Record {
            size: 1 << 20,
            map: None,
            remote: vec![Remote {
                kind: "http".into(),
                what: "file".into(),
                name: vec!["https://h/d.raw".into()],
                version: vec![
                    ("length".into(), Some("1048576".into())),
                    ("ETag".into(), Some("\"e\"".into())),
                    ("Last-Modified".into(), None),
                ],
            }],
            files: vec![],
        };
        assert_eq!(then, now);
        assert_eq!(now.to_text(), text);
        let mut changed = now.clone();
        changed.remote[0].version[1].1 = Some("\"f\"".into());
        let why = then.changed_since(&changed, "the checkpoint").unwrap();
        assert!(
            why.contains("its ETag is \"f\", the checkpoint recorded \"e\""),
            "{why}"
        );
    }

    #[test]
    fn the_image_file_replaced_is_named() {
        let then = Record {
            size: 100,
            map: None,
            remote: vec![],
            files: vec![stamp("/d.qcow2")],
        };
        let mut written = then.clone();
        written.files[0].mtime = (9, 0);
        assert_eq!(then.image_replaced(&written, "OLD"), None);
        let mut other = then.clone();
        other.files[0].ino = 77;
        let why = then.image_replaced(&other, "OLD").unwrap();
        assert!(
            why.starts_with("the file at its path is not the one OLD was made from"),
            "{why}"
        );
    }
}
