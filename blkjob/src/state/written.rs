//! DSTs blksync wrote, recorded where every later run finds them whatever
//! paths it names: a PBS fixed index stops describing DST the moment a
//! run writes DST, and nothing a run names (`--save-state`, a dated map)
//! tells the next run so.
//!
//! Why a record bound to DST, and not the other guards one could think of:
//!
//! - A guard bound to a path the run names (the side record beside
//!   `--save-state`, which blksync keeps too) is passed by a run that
//!   names another path: `--save-state run2.map` after `run1.map`.
//! - Reading DST's digests only where the index and SRC disagree misses
//!   the case that matters: SRC rolled back to the backup agrees with the
//!   index everywhere, and DST still holds the chunks an earlier run wrote.
//! - Sampled chunks (16) miss a changed chunk with a probability of about
//!   15/16 when one chunk changed.
//! - Refusing an index "when DST was written since" needs to know since
//!   when: a restore writes DST after the backup was made, so neither the
//!   index's ctime nor DST's times tell a restore from a later run.
//!
//! So every run that takes an index as DST's state, and every run that
//! writes a DST that has a record, keeps one here, under a name derived
//! from what DST is (a file's device and inode, a block device's number,
//! an export's URL), in `$XDG_STATE_HOME/blkhash/written/` (else
//! `~/.local/state/blkhash/written/`): first "writing" before DST is
//! written, then DST's identity and times once it is flushed. A run from
//! an index is refused while a record says blksync wrote DST and DST is
//! unchanged since (a file: same device, inode, size and times; a block
//! device's times do not move when it is written, so it stays refused
//! until the record is removed, as the message says); a file written
//! since by other means (restored again) makes the record stale, and the
//! index is judged as before (its samples).
//!
//! The format, one field a line: `blksync-written 1`, `dst NAME`,
//! `state PATH` (or `state -`), `at SECONDS` (since the epoch), then, once
//! the run finished, DST's [`Record`] as side records hold it.

use crate::record::Record;
use std::io::{self, Write};
use std::path::PathBuf;

const MAGIC: &str = "blksync-written 1";

/// What a record says.
#[derive(Debug, PartialEq)]
pub struct Written {
    /// DST as the run named it.
    pub dst: String,
    /// The state that run saved (its `--save-state` or `--state`), if any.
    pub state: Option<PathBuf>,
    /// When the run began writing DST (seconds since the epoch).
    pub at: i64,
    /// DST once the run finished; `None` while writing (or a run stopped).
    pub after: Option<Record>,
}

/// The directory of the records: `$XDG_STATE_HOME/blkhash/written`, else
/// `$HOME/.local/state/blkhash/written`; `None` if neither is set.
pub fn dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => {
            PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".local/state")
        }
    };
    Some(base.join("blkhash/written"))
}

/// The record's path for DST's identity `key` (in [`dir`]).
pub fn path_of(key: &str) -> Option<PathBuf> {
    let mut d = [0u8; 32];
    blkhash::Algorithm::Sha256.digest_into(key.as_bytes(), &mut d);
    Some(dir()?.join(blkhash::to_hex(&d[..16])))
}

impl Written {
    fn to_text(&self) -> String {
        let state = match &self.state {
            Some(p) => p.display().to_string(),
            None => "-".into(),
        };
        let one_line = |s: &str| s.replace('\n', "?");
        let mut s = format!(
            "{MAGIC}\ndst {}\nstate {}\nat {}\n",
            one_line(&self.dst),
            one_line(&state),
            self.at
        );
        if let Some(r) = &self.after {
            s += &r.to_text();
        }
        s
    }

    fn parse(text: &[u8]) -> Result<Written, String> {
        let damaged = |why: &str| format!("damaged: {why}");
        let text = std::str::from_utf8(text).map_err(|_| damaged("not text"))?;
        let mut lines = text.splitn(5, '\n');
        if lines.next() != Some(MAGIC) {
            return Err(format!("not a '{MAGIC}' record"));
        }
        let mut field = |name: &str| {
            lines
                .next()
                .and_then(|l| l.strip_prefix(name))
                .and_then(|l| l.strip_prefix(' '))
                .map(str::to_string)
                .ok_or_else(|| damaged(&format!("no {name} line")))
        };
        let dst = field("dst")?;
        let state = Some(field("state")?)
            .filter(|s| s != "-")
            .map(PathBuf::from);
        let at = field("at")?.parse().map_err(|_| damaged("a bad time"))?;
        let rest = lines.next().unwrap_or("");
        let after = match rest.is_empty() {
            true => None,
            false => Some(Record::parse(rest.as_bytes()).map_err(|e| damaged(&e))?),
        };
        Ok(Written {
            dst,
            state,
            at,
            after,
        })
    }

    /// Why a run may not take an index as the state of DST, which is
    /// `now`, if it may not: this record says blksync wrote it.
    pub fn refuses_index(&self, now: &Record) -> Option<String> {
        let when = humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(self.at.max(0) as u64),
        );
        let state = match &self.state {
            Some(p) => format!("run with --state {} instead", p.display()),
            None => "that run saved no state: run with --force-rescan".into(),
        };
        match &self.after {
            None => Some(format!(
                "a blksync run began writing DST at {when} and did not finish, so the index no \
                 longer says what DST holds; {state} (DST is read and compared if the map is not \
                 there)"
            )),
            Some(then) if then.changed_since(now, "blksync's record").is_some() => None,
            Some(_) => Some(format!(
                "blksync wrote DST at {when}, so the index no longer says what DST holds; {state}"
            )),
        }
    }
}

/// The record for DST's identity `key`: `Ok(None)` if there is none.
pub fn load(key: &str) -> Result<Option<(PathBuf, Written)>, String> {
    let Some(path) = path_of(key) else {
        return Ok(None);
    };
    match std::fs::read(&path) {
        Ok(t) => Written::parse(&t)
            .map(|w| Some((path.clone(), w)))
            .map_err(|why| format!("{}: {why}", path.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {}", path.display(), crate::reason(&e))),
    }
}

/// Keep `w` as the record of DST's identity `key` (atomically).
pub fn save(key: &str, w: &Written) -> io::Result<()> {
    let path = path_of(key).ok_or_else(|| {
        io::Error::other(
            "neither XDG_STATE_HOME nor HOME is set: nowhere to record that blksync wrote DST",
        )
    })?;
    if let Some(d) = path.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)?;
    }
    blkmap::write_atomic(&path, |f| f.write_all(w.to_text().as_bytes()))
}

/// The seconds since the epoch now.
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_says_why_it_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let dst = dir.path().join("dst.raw");
        std::fs::write(&dst, [1u8; 512]).unwrap();
        let meta = std::fs::metadata(&dst).unwrap();
        let now = Record::of_target("00".into(), &dst, &meta, 512);
        let mut w = Written {
            dst: "dst.raw".into(),
            state: Some("run1.map".into()),
            at: 1_764_288_000,
            after: None,
        };
        assert_eq!(Written::parse(w.to_text().as_bytes()).unwrap(), w);
        let why = w.refuses_index(&now).unwrap();
        assert!(why.contains("did not finish"), "{why}");
        w.after = Some(now.clone());
        assert_eq!(Written::parse(w.to_text().as_bytes()).unwrap(), w);
        let why = w.refuses_index(&now).unwrap();
        assert!(why.contains("--state run1.map"), "{why}");
        // Written since by other means (restored again): stale.
        std::fs::write(&dst, [2u8; 1024]).unwrap();
        let meta = std::fs::metadata(&dst).unwrap();
        let later = Record::of_target("00".into(), &dst, &meta, 1024);
        assert_eq!(w.refuses_index(&later), None);
        let mut text = w.to_text().into_bytes();
        let at = text.len() - 70;
        text[at] ^= 1;
        assert!(Written::parse(&text).unwrap_err().starts_with("damaged"));
    }
}
