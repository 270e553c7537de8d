//! Whether a loaded state describes DST, and what a run does with it.

use super::{check_samples, load_side, side_of};
use crate::{header_mismatch, reason};
use blkhash::Algorithm;
use blkimage::Source;
use blkimage::nbd::Nbd;
use blkmap::MapLike;
use std::fs::{File, Metadata};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// DST as it is now, to check a state against.
pub enum DstNow<'a> {
    /// A raw file or a block device.
    File(&'a File),
    /// An export; for an image file blksync serves, the file as it was
    /// before the server opened it.
    Nbd(&'a Nbd, Option<&'a Metadata>),
}

impl DstNow<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self {
            DstNow::File(f) => f.read_exact_at(buf, offset),
            DstNow::Nbd(n, _) => n.read_at(buf, offset),
        }
    }
}

/// Why the state `map` (from `path`) is not DST's, if it is not: DST
/// hashed with `algorithm` (its block digests keyed with `key`) and `block_size`, `dst` as it is now (`None`:
/// it does not exist), of `dst_size` bytes. Cheap checks only: the
/// parameters, the size, the side record (same file, size and times; none
/// for NBD exports), and a few sampled blocks read from DST.
pub fn check(
    map: &dyn MapLike,
    path: &Path,
    (algorithm, key): (Algorithm, &[u8]),
    block_size: usize,
    dst: Option<DstNow<'_>>,
    dst_size: u64,
) -> Result<(), String> {
    let h = map.header();
    if let Some(why) = header_mismatch(&h, algorithm, block_size) {
        return Err(why);
    }
    let Some(checksum) = h.checksum.as_ref() else {
        return Err("a part of a map, not a whole map: not a state".into());
    };
    let Some(dst) = dst else {
        return Err("DST does not exist: not its state".into());
    };
    if h.size != dst_size {
        return Err(format!(
            "it is of a {}-byte image and DST is {dst_size} bytes: not its state",
            h.size
        ));
    }
    // DST's name is not compared: the file it leads to is.
    let unnamed = Path::new("");
    let now = match &dst {
        DstNow::File(f) => {
            let meta = f.metadata().map_err(|e| reason(&e))?;
            Some(side_of(checksum, unnamed, &meta, dst_size))
        }
        DstNow::Nbd(_, Some(meta)) => Some(side_of(checksum, unnamed, meta, meta.len())),
        DstNow::Nbd(_, None) => None,
    };
    if let (Some(now), Some(side)) = (now, load_side(path, map)?)
        && let Some(why) = side.changed_since(&now, "the state")
    {
        return Err(format!("DST changed since the state was saved: {why}"));
    }
    match check_samples(&|buf, offset| dst.read_at(buf, offset), map, key) {
        Ok(None) => Ok(()),
        Ok(Some(i)) => Err(format!(
            "DST changed since the state was saved: its block {i} (offset {}) does not hold what the state says",
            i * h.block_size as u64
        )),
        Err(e) => Err(format!("reading DST: {}", reason(&e))),
    }
}

/// What a run does with a state that exists (`M`: its map, as opened).
#[derive(Debug)]
pub enum Verdict<M> {
    /// It describes DST: DST's blocks are taken from it, DST is not read.
    Use(M),
    /// DST is read and compared; `warning` says why the state would have
    /// been refused, if it would.
    Rescan {
        /// Why the state is not DST's (`--force-rescan` asked to go on).
        warning: Option<String>,
    },
    /// The run stops: the state is not DST's, for this reason.
    Refuse(String),
}

/// The verdict on a state that loaded and was checked to `checked`
/// (its map, or why it is not DST's), with or without `--force-rescan`.
pub fn verdict<M>(checked: Result<M, String>, force_rescan: bool) -> Verdict<M> {
    match (checked, force_rescan) {
        (Ok(m), false) => Verdict::Use(m),
        (Ok(_), true) => Verdict::Rescan { warning: None },
        (Err(why), false) => Verdict::Refuse(why),
        (Err(why), true) => Verdict::Rescan { warning: Some(why) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{save_side_of, side_path};
    use blkhash::Options;
    use blkmap::Map;
    use std::io::Write;

    const BS: usize = 4096;

    /// A DST file of `blocks` blocks of data, its state saved beside it.
    fn dst_and_state(dir: &Path, blocks: usize) -> (File, std::path::PathBuf, Map) {
        let path = dir.join("dst.raw");
        let data: Vec<u8> = (0..blocks * BS).map(|i| (i / BS) as u8 + 1).collect();
        std::fs::write(&path, &data).unwrap();
        let map = Map::compute(Options::new().block_size(BS), &data).unwrap();
        let state = dir.join("dst.map");
        let f = File::options().read(true).write(true).open(&path).unwrap();
        map.save(&state).unwrap();
        save_side_of(&state, map.checksum(), Some(&f), &path, data.len() as u64).unwrap();
        (f, state, map)
    }

    fn check_file(map: &Map, state: &Path, f: &File) -> Result<(), String> {
        let size = f.metadata().unwrap().len();
        check(
            map,
            state,
            (Algorithm::Sha256, &[]),
            BS,
            Some(DstNow::File(f)),
            size,
        )
    }

    #[test]
    fn a_state_saved_with_its_dst_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let (f, state, map) = dst_and_state(dir.path(), 40);
        assert_eq!(check_file(&map, &state, &f), Ok(()));
        // Without its side record, the sampled blocks still vouch for it.
        std::fs::remove_file(side_path(&state)).unwrap();
        assert_eq!(check_file(&map, &state, &f), Ok(()));
    }

    #[test]
    fn other_parameters_a_missing_dst_or_another_size_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (f, state, map) = dst_and_state(dir.path(), 4);
        let size = 4 * BS as u64;
        let other = check(
            &map,
            &state,
            (Algorithm::Blake3, &[]),
            BS,
            Some(DstNow::File(&f)),
            size,
        );
        assert!(
            other
                .unwrap_err()
                .contains("not blake3 of 4096-byte blocks")
        );
        let block = check(
            &map,
            &state,
            (Algorithm::Sha256, &[]),
            512,
            Some(DstNow::File(&f)),
            size,
        );
        assert!(
            block
                .unwrap_err()
                .contains("of 4096-byte blocks, not sha256 of 512")
        );
        let missing = check(&map, &state, (Algorithm::Sha256, &[]), BS, None, 0);
        assert_eq!(missing.unwrap_err(), "DST does not exist: not its state");
        f.set_len(5 * BS as u64).unwrap();
        let grown = check_file(&map, &state, &f).unwrap_err();
        assert!(
            grown.contains("16384-byte image and DST is 20480 bytes"),
            "{grown}"
        );
    }

    #[test]
    fn a_dst_written_behind_the_states_back_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (mut f, state, map) = dst_and_state(dir.path(), 4);
        // Same size, new bytes: the times in the side record tell.
        std::thread::sleep(std::time::Duration::from_millis(20));
        f.write_all_at(b"x", 5).unwrap();
        f.flush().unwrap();
        let why = check_file(&map, &state, &f).unwrap_err();
        assert!(
            why.starts_with("DST changed since the state was saved"),
            "{why}"
        );
        // Without the record, the first block (always sampled) tells.
        std::fs::remove_file(side_path(&state)).unwrap();
        let why = check_file(&map, &state, &f).unwrap_err();
        assert!(
            why.contains("its block 0 (offset 0) does not hold"),
            "{why}"
        );
    }

    #[test]
    fn a_damaged_side_record_refuses_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let (f, state, map) = dst_and_state(dir.path(), 2);
        let side = side_path(&state);
        let text = std::fs::read_to_string(&side).unwrap();
        std::fs::write(&side, text.replace("file file", "file fool")).unwrap();
        let why = check_file(&map, &state, &f).unwrap_err();
        assert!(why.contains("dst.map.dst: damaged"), "{why}");
    }

    #[test]
    fn verdicts() {
        let map = || Map::compute(Options::new().block_size(BS), &[1u8; 10]).unwrap();
        assert!(matches!(verdict(Ok(map()), false), Verdict::Use(_)));
        assert!(matches!(
            verdict(Ok(map()), true),
            Verdict::Rescan { warning: None }
        ));
        assert!(matches!(verdict::<Map>(Err("x".into()), false), Verdict::Refuse(w) if w == "x"));
        assert!(matches!(
            verdict::<Map>(Err("x".into()), true),
            Verdict::Rescan { warning: Some(w) } if w == "x"
        ));
    }
}
