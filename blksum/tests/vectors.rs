//! Every raw reference vector through the command: by path (several images
//! per call, as QEMU sizes them) and from a pipe (the exact bytes).

mod common;

use common::*;
use std::collections::BTreeMap;

#[test]
fn raw_vectors_by_path_and_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let vectors: Vec<_> = testkit::vectors()
        .into_iter()
        .filter(|v| v.format.is_none())
        .collect();
    assert!(!vectors.is_empty(), "no raw vector in vectors.json");
    let mut images = BTreeMap::new();
    for v in &vectors {
        let n = images.len();
        images
            .entry(v.recipe.clone())
            .or_insert_with(|| image(dir.path(), &format!("img{n}.raw"), &v.recipe));
    }
    // By path: one call per digest and block size, every image of that kind at once.
    let mut groups: BTreeMap<(String, usize), Vec<&testkit::Vector>> = BTreeMap::new();
    for v in &vectors {
        groups
            .entry((v.digest.clone(), v.block_size))
            .or_default()
            .push(v);
    }
    let mut checked = 0;
    for ((digest, bs), group) in &groups {
        let bs_arg = bs.to_string();
        let mut args = vec!["-d", digest, "--block-size", &bs_arg];
        let paths: Vec<String> = group
            .iter()
            .map(|v| images[&v.recipe].to_str().unwrap().to_string())
            .collect();
        args.extend(paths.iter().map(|s| s.as_str()));
        let out = run(&args, None);
        assert!(out.status.success(), "{digest} {bs}: {}", stderr(&out));
        let lines: Vec<String> = stdout(&out).lines().map(String::from).collect();
        assert_eq!(lines.len(), group.len());
        for ((v, line), path) in group.iter().zip(&lines).zip(&paths) {
            assert_eq!(
                line,
                &format!("{}  {path}", v.file),
                "file: {} {digest} {bs}",
                v.recipe
            );
            checked += 1;
        }
    }
    assert_eq!(checked, vectors.len());
    // From a pipe: the exact bytes, named "-". Every vector, or with
    // BLKHASH_TEST_PIPES=differing those whose exact bytes have a checksum
    // of their own (136 of 551): the arm64 step (scripts/test-cross.sh),
    // where each process costs a third of a second of emulation to start;
    // the others differ from their run by path only in how the bytes come,
    // which is no architecture's code.
    let differing = match std::env::var("BLKHASH_TEST_PIPES").as_deref() {
        Err(_) | Ok("all") => false,
        Ok("differing") => true,
        Ok(other) => panic!("BLKHASH_TEST_PIPES={other}: all or differing"),
    };
    let piped: Vec<_> = vectors
        .iter()
        .filter(|v| !differing || v.pipe.is_some())
        .collect();
    assert!(!piped.is_empty());
    for v in &piped {
        let bs = v.block_size.to_string();
        let out = run_pipe(&["-d", &v.digest, "--block-size", &bs], &images[&v.recipe]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(
            stdout(&out),
            format!("{}  -\n", v.pipe_checksum()),
            "pipe: {} {} {bs}",
            v.recipe,
            v.digest
        );
        checked += 1;
    }
    assert_eq!(checked, vectors.len() + piped.len());
}
