//! blkmap, blkdiff and blksync with HTTP URLs served by a real nginx: a
//! URL's map is the file's (whole or in parts; each records what it was
//! made from), blkdiff finds no difference between a URL and its file,
//! blksync copies from a URL, and a URL as DST is refused; a misspelt
//! scheme is named.

use crate::common;

use common::*;
use testkit::http::{Nginx, have_nginx};

#[test]
fn maps_diffs_and_copies_from_a_url() {
    if !(have_qemu() && have_nginx()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    let img = image(
        &www,
        "disk.qcow2",
        "qcow2",
        8 * MIB,
        &[
            "write -P 0x11 0 1m",
            "write -P 0x22 5m 64k",
            "write -z 6m 1m",
        ],
    );
    sh("qemu-img", &["bitmap", "--add", s(&img), "nightly"]);
    let nginx = Nginx::start(&www, None, "");
    let url = format!("{}/disk.qcow2", nginx.url);
    let at = |n: &str| dir.path().join(n);

    sh(BLKMAP, &[s(&img), s(&at("file.map"))]);
    sh(BLKMAP, &[&url, s(&at("url.map"))]);
    // Byte for byte but for what each records it was made from (a file,
    // a URL).
    dirty::assert_same_map(&at("url.map"), &at("file.map"));
    for k in 1..=3 {
        sh(
            BLKMAP,
            &["--range", &format!("{k}/3"), &url, s(&at(&format!("p{k}")))],
        );
    }
    let merged = run(
        BLKMAP,
        &[
            "merge",
            s(&at("merged.map")),
            s(&at("p1")),
            s(&at("p2")),
            s(&at("p3")),
        ],
    );
    assert_eq!(merged.code, 0, "{}", merged.stderr);
    dirty::assert_same_map(&at("merged.map"), &at("file.map"));
    let listed = run(BLKMAP, &["bitmaps", &url]);
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    assert!(listed.stdout.contains("nightly"), "{}", listed.stdout);

    let diff = run(BLKDIFF, &[&url, s(&img)]);
    assert_eq!(diff.code, 0, "{} {}", diff.stdout, diff.stderr);

    let dst = at("dst.raw");
    let copied = run(BLKSYNC, &[&url, s(&dst)]);
    assert_eq!(copied.code, 0, "{}", copied.stderr);
    assert!(same(&img, &dst));

    let refused = run(BLKSYNC, &[s(&img), &url]);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("an HTTP(S) URL is read here, never written"),
        "{}",
        refused.stderr
    );
    // The first byte of the served file is untouched.
    assert_eq!(std::fs::read(&img).unwrap()[..4], *b"QFI\xfb");
}

/// A KubeVirt VirtualMachineExport's volume (nginx answering as its
/// server does, over TLS with the export's CA): blkmap and blkdiff of its
/// disk.img with the token from a file (`--header @FILE`) and the CA as
/// `--tls-certificates FILE`, the map the local file's, no difference.
#[test]
fn maps_and_diffs_of_a_kubevirt_export() {
    if !(have_qemu() && have_nginx() && require(&["certtool"])) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("www/volumes/pvc-1");
    std::fs::create_dir_all(&vol).unwrap();
    let img = image(&vol, "disk.img", "raw", 6 * MIB, &["write -P 0x11 1m 2m"]);
    let pki = testkit::nbd::make_pki(&dir.path().join("pki"));
    let tls = testkit::http::Tls {
        server: &pki.server,
        client_ca: None,
    };
    let locations = testkit::http::kubevirt_export_locations("t0k");
    let nginx = Nginx::start(&dir.path().join("www"), Some(tls), &locations);
    let url = format!("{}/volumes/pvc-1/disk.img", nginx.url);
    let token = dir.path().join("token");
    std::fs::write(&token, "x-kubevirt-export-token: t0k\n").unwrap();
    let token = format!("@{}", s(&token));
    let ca = pki.ca_only.join("ca-cert.pem");
    let with = ["--tls-certificates", s(&ca), "--header", &token];
    let at = |n: &str| dir.path().join(n);
    sh(BLKMAP, &[s(&img), s(&at("file.map"))]);
    sh(BLKMAP, &[&with[..], &[&url, s(&at("url.map"))]].concat());
    dirty::assert_same_map(&at("url.map"), &at("file.map"));
    let diff = run(BLKDIFF, &[&with[..], &[&url, s(&img)]].concat());
    assert_eq!(diff.code, 0, "{} {}", diff.stdout, diff.stderr);
    let refused = run(BLKDIFF, &["--tls-certificates", s(&ca), &url, s(&img)]);
    // blkdiff's trouble, as diff's and cmp's: 2.
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("HTTP 401")
            && refused
                .stderr
                .contains("--header 'x-kubevirt-export-token: TOKEN'"),
        "{}",
        refused.stderr
    );
}

#[test]
fn misspelt_schemes_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.map");
    let r = run(BLKMAP, &["ndb://host/disk", s(&out)]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("unknown URL scheme 'ndb'"),
        "{}",
        r.stderr
    );
    let r = run(BLKSYNC, &["ftp://host/disk", s(&out)]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("unknown URL scheme 'ftp'"),
        "{}",
        r.stderr
    );
    assert!(!out.exists());
}
