//! Checking lists against images whose content is their own name.

use super::*;
use blkhash::{Hasher, Options};

/// "Images" are names whose content is the name itself; "missing" does not exist.
fn compute(name: &OsStr, (c, alg, bs): Tag) -> io::Result<Checksum> {
    if name.as_bytes().starts_with(b"missing") {
        return Err(io::Error::from(io::ErrorKind::NotFound));
    }
    let opts = Options::new().construction(c).algorithm(alg).block_size(bs);
    let mut h = Hasher::with_options(opts.threads(1)).unwrap();
    h.update(name.as_bytes());
    Ok(h.finalize())
}

fn sum(name: &str, alg: Algorithm, bs: usize) -> String {
    sum_in(Construction::Blkhash, name, alg, bs)
}

fn sum_in(c: Construction, name: &str, alg: Algorithm, bs: usize) -> String {
    compute(OsStr::new(name), (c, alg, bs)).unwrap().to_hex()
}

#[test]
fn tags_name_the_construction() {
    let c = Construction::Imageio;
    let (alg, bs) = (Algorithm::Blake2b256, 4 << 20);
    let good = sum_in(c, "a.img", alg, bs);
    let list = lines::format_line(&good, "a.img", Some((c, alg, bs)));
    let (ok, out, _) = run(&list, &opts());
    assert!(ok, "{out}");
    // The same digest in blkhash 0.11's construction is another checksum.
    let other = sum("a.img", alg, bs);
    let list = lines::format_line(&other, "a.img", Some((c, alg, bs)));
    assert!(!run(&list, &opts()).0);
    // Untagged lines take the command line's construction.
    let plain = CheckOptions {
        construction: c,
        algorithm: alg,
        block_size: bs,
        ..Default::default()
    };
    assert!(run(&format!("{good}  a.img\n"), &plain).0);
}

fn run(list: &str, opts: &CheckOptions) -> (bool, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let ok = check_file(
        "sums",
        &mut list.as_bytes(),
        opts,
        &mut compute,
        &mut out,
        &mut err,
    )
    .unwrap();
    (
        ok,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

fn opts() -> CheckOptions {
    CheckOptions {
        block_size: 65536,
        ..Default::default()
    }
}

#[test]
fn ok_failed_and_missing() {
    let good = sum("a.img", Algorithm::Sha256, 65536);
    let list = format!("{good}  a.img\n{good}  b.img\n{good}  missing.img\n");
    let (ok, out, err) = run(&list, &opts());
    assert!(!ok);
    assert_eq!(
        out,
        "a.img: OK\nb.img: FAILED\nmissing.img: FAILED open or read\n"
    );
    assert!(
        err.contains("WARNING: 1 computed checksum did NOT match"),
        "{err}"
    );
    assert!(
        err.contains("WARNING: 1 listed file could not be read"),
        "{err}"
    );

    let quiet = CheckOptions {
        quiet: true,
        ..opts()
    };
    let (_, out, _) = run(&list, &quiet);
    assert_eq!(out, "b.img: FAILED\nmissing.img: FAILED open or read\n");

    let status = CheckOptions {
        status: true,
        ..opts()
    };
    let (ok, out, err) = run(&list, &status);
    assert!(!ok);
    assert_eq!(out, "");
    assert!(!err.contains("WARNING"));

    let ignore = CheckOptions {
        ignore_missing: true,
        ..opts()
    };
    let (ok, out, _) = run(&format!("{good}  a.img\n{good}  missing.img\n"), &ignore);
    assert!(ok);
    assert_eq!(out, "a.img: OK\n");
    let (ok, _, err) = run(&format!("{good}  missing.img\n"), &ignore);
    assert!(!ok);
    assert!(err.contains("no file was verified"));
}

#[test]
fn a_list_where_nothing_matches_is_named_as_another_construction() {
    // What sha256sum writes for these "images" (their content is their name).
    let plain = |n: &str| {
        let mut d = [0u8; 32];
        Algorithm::Sha256.digest_into(n.as_bytes(), &mut d);
        blkhash::to_hex(&d)
    };
    let list: String = ["a.img", "b.img"]
        .iter()
        .map(|n| format!("{}  {n}\n", plain(n)))
        .collect();
    let (ok, out, err) = run(&list, &opts());
    assert!(!ok);
    assert_eq!(out, "a.img: FAILED\nb.img: FAILED\n");
    assert!(
        err.contains(
            "sums: no listed image matched: the images may have changed since the list was \
             made, or be damaged; or the list was made otherwise: the checksums are 64 hex \
             digits, as sha256, \
             sha512-256, sha3-256, blake2b-256, blake2s256, sm3, shake256 and blake3 write \
             them, made \
             with another --digest or --block-size? (`blksum -c -d blake3 --block-size 1m \
             sums` checks them if they were made so) Or checksums of another construction"
        ),
        "{err}"
    );
    // One match, or a tagged line (it says how it was made): no such hint.
    let good = sum("a.img", Algorithm::Sha256, 65536);
    let (_, _, err) = run(&format!("{good}  a.img\n{list}"), &opts());
    assert!(!err.contains("another construction"), "{err}");
    let tagged = lines::format_line(
        &"0".repeat(64),
        "a.img",
        Some((Construction::Blkhash, Algorithm::Sha256, 65536)),
    );
    let (_, _, err) = run(&format!("{tagged}\n"), &opts());
    assert!(!err.contains("another construction"), "{err}");
}

#[test]
fn a_list_whose_images_all_changed_says_so_first() {
    // Made by blksum with the default options, of images that have
    // changed since (their content is their name: another name).
    let list = format!(
        "{}  a.img\n{}  b.img\n",
        sum("a.img.before", Algorithm::Sha256, 65536),
        sum("b.img.before", Algorithm::Sha256, 65536)
    );
    let (ok, out, err) = run(&list, &opts());
    assert!(!ok);
    assert_eq!(out, "a.img: FAILED\nb.img: FAILED\n");
    let hint = err
        .lines()
        .find(|l| l.contains("no listed image matched"))
        .unwrap();
    let changed = hint.find("may have changed since the list was made, or be damaged");
    let options = hint.find("another --digest or --block-size");
    assert!(changed.is_some() && changed < options, "{err}");
}

/// `names`' plain lines as blksum writes them with `alg` and `bs`.
fn plain_list(names: &[&str], alg: Algorithm, bs: usize) -> String {
    names
        .iter()
        .map(|n| format!("{}  {n}\n", sum(n, alg, bs)))
        .collect()
}

#[test]
fn a_list_made_with_other_options_names_them() {
    // Made with -d blake3 --block-size 1m, checked without: the same
    // length as sha256's, so the lines are read and nothing matches.
    let list = plain_list(&["a.img", "b.img"], Algorithm::Blake3, 1 << 20);
    let (ok, _, err) = run(&list, &opts());
    assert!(!ok);
    assert!(err.contains("64 hex digits, as sha256, "), "{err}");
    assert!(
        err.contains("`blksum -c -d blake3 --block-size 1m sums`"),
        "{err}"
    );
    // Checked with them, it verifies.
    let made = CheckOptions {
        algorithm: Algorithm::Blake3,
        block_size: 1 << 20,
        ..opts()
    };
    assert!(run(&list, &made).0);

    // Made with sha512: no line fits sha256, and the digests that
    // write 128 hex digits are named, on each line with --warn too.
    let list = plain_list(&["a.img"], Algorithm::Sha512, 65536);
    let (ok, _, err) = run(&list, &opts());
    assert!(!ok);
    assert!(
        err.contains("sums: no properly formatted checksum lines found\n"),
        "{err}"
    );
    assert!(
        err.contains(
            "sums: the checksums are 128 hex digits, as sha512, sha3-512 and blake2b512 \
             write them, not sha256: made with another --digest? (`blksum -c -d sha512 \
             sums` checks them if they were made so, with --block-size too if their blocks \
             were not of 64k)"
        ),
        "{err}"
    );
    let warn = CheckOptions {
        warn: true,
        ..opts()
    };
    let (_, _, err) = run(&list, &warn);
    assert!(
        err.contains(
            "sums: 1: checksum length does not fit sha256 (128 hex digits: sha512, \
             sha3-512 and blake2b512)"
        ),
        "{err}"
    );
    // --status: nothing but what sha256sum says too.
    let status = CheckOptions {
        status: true,
        ..opts()
    };
    let (_, _, err) = run(&list, &status);
    assert_eq!(
        err,
        "blksum: sums: no properly formatted checksum lines found\n"
    );
}

#[test]
fn a_tagged_line_gives_the_exact_options_for_the_plain_ones() {
    let (alg, bs) = (Algorithm::Blake3, 1 << 20);
    let tagged = lines::format_line(
        &sum("a.img", alg, bs),
        "a.img",
        Some((Construction::Blkhash, alg, bs)),
    );
    let list = format!("{tagged}\n{}", plain_list(&["b.img"], alg, bs));
    let (ok, out, err) = run(&list, &opts());
    assert!(!ok);
    assert_eq!(out, "a.img: OK\nb.img: FAILED\n");
    assert!(
        err.contains(
            "sums: no image of an untagged line matched: those images may have changed \
             since the list was made, or be damaged; or those lines were made otherwise: \
             its tagged lines were made with \
             -d blake3 and blocks of 1m: `blksum -c -d blake3 --block-size 1m sums` checks \
             the untagged ones if they were made so too"
        ),
        "{err}"
    );
}

#[test]
fn bsd_lines_of_other_tools_are_named() {
    let hex = "ab".repeat(32);
    let (ok, _, err) = run(&format!("SHA256 (a.img) = {hex}\n"), &opts());
    assert!(!ok);
    assert!(
        err.contains(
            "sums: lines such as 'SHA256 (NAME) = HEX' are the BSD-style lines of \
             sha256sum --tag or cksum"
        ),
        "{err}"
    );
    assert!(
        err.contains("blksum --tag writes 'blkhash/sha256 (NAME) = HEX'"),
        "{err}"
    );
    assert_eq!(
        foreign_tag(b"BLAKE2b (x (1)) = 00ff"),
        Some("BLAKE2b".into())
    );
    for not in [&b"a (b) = xyz"[..], b"a b (c) = 00", b" (c) = 00", b"ab  c"] {
        assert_eq!(foreign_tag(not), None, "{:?}", String::from_utf8_lossy(not));
    }
}

#[test]
fn tagged_lines_need_no_options() {
    let alg = Algorithm::Blake3;
    let line = lines::format_line(
        &sum("x", alg, 4096),
        "x",
        Some((Construction::Blkhash, alg, 4096)),
    );
    let (ok, out, _) = run(&format!("{line}\n"), &opts());
    assert!(ok, "{out}");
    assert_eq!(out, "x: OK\n");
}

#[test]
fn malformed_lines_warn_and_strict() {
    let good = sum("a.img", Algorithm::Sha256, 65536);
    let list = format!("garbage\n{good}  a.img\nabc  short.img\n");
    let (ok, out, err) = run(&list, &opts());
    assert!(ok);
    assert_eq!(out, "a.img: OK\n");
    assert!(
        err.contains("WARNING: 2 lines are improperly formatted"),
        "{err}"
    );
    assert!(!err.contains("sums: 1:"));
    let warn = CheckOptions {
        warn: true,
        ..opts()
    };
    let (_, _, err) = run(&list, &warn);
    assert!(err.contains("sums: 1: improperly formatted"), "{err}");
    assert!(err.contains("sums: 3:"), "{err}");
    let strict = CheckOptions {
        strict: true,
        ..opts()
    };
    assert!(!run(&list, &strict).0);
    let (ok, _, err) = run("nothing here\n", &opts());
    assert!(!ok);
    assert!(err.contains("no properly formatted checksum lines found"));
}

#[test]
fn names_with_newlines() {
    let name = "new\nline";
    let line = lines::format_line(&sum(name, Algorithm::Sha256, 65536), name, None);
    let (ok, out, _) = run(&format!("{line}\n"), &opts());
    assert!(ok);
    assert_eq!(out, "\\new\\nline: OK\n");
}

#[test]
fn binary_files_are_refused_at_once() {
    let mut image = vec![b'Q', b'F', b'I', 0xfb, 0, 0, 0, 3];
    image.resize(1 << 20, 0);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut calls = 0;
    let r = check_file(
        "disk.qcow2",
        &mut image.as_slice(),
        &opts(),
        &mut |_, _| {
            calls += 1;
            Err(io::Error::other("never"))
        },
        &mut out,
        &mut err,
    );
    assert!(r.unwrap_err().to_string().contains("not a checksum file"));
    assert_eq!(calls, 0);
    let long = "a".repeat(MAX_LINE + 10);
    let r = check_file(
        "long",
        &mut long.as_bytes(),
        &opts(),
        &mut compute,
        &mut out,
        &mut err,
    );
    assert!(r.unwrap_err().to_string().contains("longer"));
}
