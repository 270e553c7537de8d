//! HTTP(S) URLs against real servers: nginx (plain and TLS with
//! certificates made here), Python's http.server (no ranges), and
//! testkit's hostile server. Every checksum is blksum's of the same file;
//! nginx's access log shows what was fetched; every bad server ends in
//! exit 1 with the URL and the reason, no checksum, no hang.

use crate::common;

use common::qemu::{create_qcow2, run_timeout};
use common::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;
use testkit::http::{
    ConnectProxy, Hostile, Logged, Misbehave, Nginx, PythonServer, Tls, have_nginx,
};
use testkit::tools::{qemu_img, qemu_img_in, qemu_io, qemu_io_in};

/// Far above any run here: a hang fails the test.
const LIMIT: Duration = Duration::from_secs(60);

fn ready() -> bool {
    have_nginx() && require(&["qemu-img", "qemu-io"])
}

/// blksum ARGS, which must succeed; its standard output.
fn sums(args: &[&str]) -> String {
    let out = run_timeout(args, None, LIMIT);
    assert!(out.status.success(), "blksum {args:?}: {}", stderr(&out));
    stdout(&out)
}

/// The checksum blksum prints for `args`.
fn checksum(args: &[&str]) -> String {
    sums(args).split_whitespace().next().unwrap().to_string()
}

/// blksum ARGS, which must fail with exit 1 and no checksum; its stderr.
fn fails(args: &[&str]) -> String {
    let out = run_timeout(args, None, LIMIT);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "blksum {args:?}: {err}");
    assert!(out.stdout.is_empty(), "checksum printed: {}", stdout(&out));
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// `qemu-img convert -f raw -O qcow2 OPTS RAW OUT`.
fn to_qcow2(raw: &Path, out: &Path, opts: &[&str]) {
    let (raw, out) = (raw.to_str().unwrap(), out.to_str().unwrap());
    qemu_img(
        &[
            &["convert", "-q", "-f", "raw", "-O", "qcow2"],
            opts,
            &[raw, out],
        ]
        .concat(),
    );
}

/// `qemu-img create -f qcow2 -b BACKING -F FMT NAME` in `dir`: the backing
/// file named relative to the overlay.
fn overlay(dir: &Path, name: &str, backing: &str, fmt: &str) {
    qemu_img_in(
        dir,
        &[
            "create", "-q", "-f", "qcow2", "-b", backing, "-F", fmt, name,
        ],
    );
}

/// Images made by qemu-img and qemu-io in `dir`, by name: raw (with a
/// tail not a multiple of 512), qcow2, compressed, extended L2, a backing
/// chain by relative name (qcow2 on qcow2 on raw), and an external data
/// file.
fn images(dir: &Path) -> Vec<&'static str> {
    let raw = image(dir, "disk.raw", "1m:r 2m:- 1m:t 512k:0 700000:r");
    to_qcow2(&raw, &dir.join("disk.qcow2"), &[]);
    to_qcow2(&raw, &dir.join("zlib.qcow2"), &["-c"]);
    to_qcow2(
        &raw,
        &dir.join("ext.qcow2"),
        &["-o", "extended_l2=on,cluster_size=128k"],
    );
    std::fs::copy(&raw, dir.join("base.raw")).unwrap();
    overlay(dir, "mid.qcow2", "base.raw", "raw");
    qemu_io(&dir.join("mid.qcow2"), "qcow2", &["write -P 0x11 64k 128k"]);
    overlay(dir, "top.qcow2", "mid.qcow2", "qcow2");
    qemu_io(
        &dir.join("top.qcow2"),
        "qcow2",
        &["write -P 0x22 1m 64k", "write -z 3m 64k"],
    );
    qemu_img_in(
        dir,
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-o",
            "data_file=ext.data",
            "data.qcow2",
            "4m",
        ],
    );
    qemu_io_in(
        dir,
        &dir.join("data.qcow2"),
        "qcow2",
        &["write -P 0x33 512k 1m"],
    );
    vec![
        "disk.raw",
        "disk.qcow2",
        "zlib.qcow2",
        "ext.qcow2",
        "top.qcow2",
        "data.qcow2",
    ]
}

#[test]
fn every_format_over_http_and_https_is_the_file_s_checksum() {
    if !(ready() && require(&["certtool"])) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    let names = images(&www);
    let pki = testkit::nbd::make_pki(&dir.path().join("pki"));
    let plain = Nginx::start(&www, None, "");
    let tls = tls_nginx(&www, &pki, None, "");
    let ca = pki.ca_only.to_str().unwrap().to_string();
    for opts in [
        &["-d", "sha256"][..],
        &["-d", "blake3", "--block-size", "1m"],
        &["-d", "sha1", "--block-size", "4k"],
    ] {
        for name in &names {
            let file = www.join(name);
            let want = checksum(&[opts, &[file.to_str().unwrap()]].concat());
            let url = format!("{}/{name}", plain.url);
            assert_eq!(
                checksum(&[opts, &[url.as_str()]].concat()),
                want,
                "{url} {opts:?}"
            );
            let url = format!("{}/{name}", tls.url);
            let got = checksum(&[opts, &["--tls-certificates", &ca, &url]].concat());
            assert_eq!(got, want, "{url} {opts:?}");
        }
    }
    // Several URLs at once, in a check list, tagged, in JSON.
    let a = format!("{}/disk.qcow2", plain.url);
    let b = format!("{}/top.qcow2", tls.url);
    let list = sums(&["--tag", "--tls-certificates", &ca, "-j", "2", &a, &b]);
    assert!(
        list.contains(&format!("({a})")) && list.contains(&format!("({b})")),
        "{list}"
    );
    std::fs::write(dir.path().join("SUMS"), &list).unwrap();
    let checked = sums(&[
        "-c",
        "--tls-certificates",
        &ca,
        dir.path().join("SUMS").to_str().unwrap(),
    ]);
    assert_eq!(checked, format!("{a}: OK\n{b}: OK\n"));
    let json: serde_json::Value = serde_json::from_str(&sums(&["--json", &a])).unwrap();
    assert_eq!(json["inputs"][0]["name"], a.as_str());
    assert_eq!(json["inputs"][0]["format"], "qcow2");
    // A client certificate the server asks for.
    let strict = tls_nginx(&www, &pki, Some(&pki.ca_only), "");
    let url = format!("{}/disk.qcow2", strict.url);
    let want = checksum(&[www.join("disk.qcow2").to_str().unwrap()]);
    let client = pki.client.to_str().unwrap();
    assert_eq!(checksum(&["--tls-certificates", client, &url]), want);
    let err = fails(&["--tls-certificates", &ca, &url]);
    assert!(err.contains(&url) && err.contains("HTTP 400"), "{err}");
    // Another CA: the certificate is not trusted.
    let err = fails(&["--tls-certificates", pki.wrong_ca.to_str().unwrap(), &b]);
    assert!(err.contains("certificate verify failed"), "{err}");
}

/// A private CA as a curl user meets it (issue #50): no option, then the
/// CA's file (curl's --cacert), a directory of CA certificates (--capath),
/// QEMU's layout, and SSL_CERT_FILE. The refusal names the option and the
/// variable.
#[test]
fn a_private_ca_is_a_file_or_a_directory() {
    if !(ready() && require(&["certtool"])) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    let raw = image(&www, "disk.raw", "1m:r 1m:- 100k:t");
    let want = checksum(&[raw.to_str().unwrap()]);
    let pki = testkit::nbd::make_pki(&dir.path().join("pki"));
    let tls = tls_nginx(&www, &pki, None, "");
    let url = format!("{}/disk.raw", tls.url);
    // The system's CAs do not know the private CA.
    let err = fails(&[&url]);
    assert!(
        err.contains(&url)
            && err.contains("certificate verify failed")
            && err.contains("--tls-certificates FILE|DIR")
            && err.contains("SSL_CERT_FILE"),
        "{err}"
    );
    let ca_file = pki.ca_only.join("ca-cert.pem");
    let ca_file = ca_file.to_str().unwrap();
    assert_eq!(checksum(&["--tls-certificates", ca_file, &url]), want);
    // A directory of CA certificates as /etc/ssl/certs holds them: any
    // names, files without certificates among them.
    let capath = dir.path().join("capath");
    std::fs::create_dir(&capath).unwrap();
    std::fs::copy(ca_file, capath.join("private-ca.crt")).unwrap();
    std::fs::copy(pki.wrong_ca.join("ca-cert.pem"), capath.join("other.pem")).unwrap();
    std::fs::write(capath.join("README"), "not a certificate\n").unwrap();
    let capath = capath.to_str().unwrap();
    assert_eq!(checksum(&["--tls-certificates", capath, &url]), want);
    // QEMU's layout, as before.
    let layout = pki.ca_only.to_str().unwrap();
    assert_eq!(checksum(&["--tls-certificates", layout, &url]), want);
    // The variable the message names.
    let out = run_env(&[&url], "SSL_CERT_FILE", ca_file);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).split_whitespace().next().unwrap(), want);
    // A directory with no certificate, and a file that is not one.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let err = fails(&["--tls-certificates", empty.to_str().unwrap(), &url]);
    assert!(err.contains("no PEM certificate"), "{err}");
    let readme = dir.path().join("capath/README");
    let err = fails(&["--tls-certificates", readme.to_str().unwrap(), &url]);
    assert!(err.contains("no PEM certificate in it"), "{err}");
    // --help and the manual page say so.
    let help = sums(&["--help"])
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(help.contains("--tls-certificates <FILE|DIR>"), "{help}");
    assert!(help.contains("as curl's --cacert or --capath"), "{help}");
    let man = sums(&["--man"]);
    assert!(
        man.contains("FILE|DIR") && man.contains("SSL_CERT_FILE"),
        "{man}"
    );
}

/// blksum ARGS with the environment variable `name` set to `value`.
fn run_env(args: &[&str], name: &str, value: &str) -> std::process::Output {
    let mut cmd = blksum();
    cmd.args(args)
        .env(name, value)
        .stdin(std::process::Stdio::null());
    cmd.output().expect("blksum runs")
}

/// nginx serving `www` over TLS with the server certificate of `pki`,
/// asking clients for one signed by `client_ca` if given.
fn tls_nginx(
    www: &Path,
    pki: &testkit::nbd::Pki,
    client_ca: Option<&Path>,
    locations: &str,
) -> Nginx {
    let tls = Tls {
        server: &pki.server,
        client_ca,
    };
    Nginx::start(www, Some(tls), locations)
}

/// The ranges nginx sent for `uri`, checked to be disjoint.
fn fetched(log: &[Logged], uri: &str) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = log
        .iter()
        .filter(|l| l.uri == uri)
        .map(|l| {
            assert_eq!(l.status, 206, "{l:?}");
            let (a, b) = l.range.expect("a range request");
            assert_eq!(b - a + 1, l.bytes, "{l:?}");
            (a, b)
        })
        .collect();
    ranges.sort();
    for w in ranges.windows(2) {
        assert!(w[0].1 < w[1].0, "a byte fetched twice: {w:?}");
    }
    ranges
}

#[test]
fn a_qcow2_image_is_fetched_as_its_clusters_and_metadata_only() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("snap.qcow2");
    create_qcow2(&img, &[], "256m");
    // 4 MiB the snapshot holds, then overwritten: the active layer's
    // clusters are new ones; the snapshot's (0xaa) must never be fetched.
    let mut writes: Vec<String> = (0..64)
        .map(|i| format!("write -P 0xaa {}k 64k", i * 1024))
        .collect();
    qemu_io(
        &img,
        "qcow2",
        &writes.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    qemu_img(&["snapshot", "-c", "s1", img.to_str().unwrap()]);
    writes = (0..64)
        .map(|i| format!("write -P 0xbb {}k 64k", i * 1024))
        .collect();
    writes.extend((0..32).map(|i| format!("write -P {} {}k 64k", i + 1, 100 * 1024 + i * 3072)));
    qemu_io(
        &img,
        "qcow2",
        &writes.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let nginx = Nginx::start(dir.path(), None, "");
    let url = format!("{}/snap.qcow2", nginx.url);
    assert_eq!(checksum(&[&url]), checksum(&[img.to_str().unwrap()]));
    let ranges = fetched(&nginx.log(), "/snap.qcow2");
    let file = std::fs::read(&img).unwrap();
    let cluster = 64 << 10;
    // The active layer's data: 96 clusters of 64 KiB (qemu-img map).
    let map: serde_json::Value =
        serde_json::from_slice(&qemu_img(&["map", "--output=json", img.to_str().unwrap()]).stdout)
            .unwrap();
    let data: u64 = map
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["data"] == true)
        .map(|e| e["length"].as_u64().unwrap())
        .sum();
    assert_eq!(data, 96 * cluster);
    let sent: u64 = ranges.iter().map(|(a, b)| b - a + 1).sum();
    // Metadata: the header cluster, the L1 table, an L2 table per 512 MiB.
    assert!(
        sent <= data + 3 * cluster,
        "{sent} bytes fetched for {data} bytes of data"
    );
    for (a, b) in &ranges {
        for c in (a / cluster..=b / cluster).map(|c| (c * cluster) as usize) {
            let whole = &file[c..(c + cluster as usize).min(file.len())];
            assert!(
                !whole.iter().all(|&x| x == 0xaa),
                "the snapshot's cluster at {c} was fetched"
            );
        }
    }
}

#[test]
fn a_server_without_ranges_streams_raw_and_refuses_qcow2() {
    if !require(&["python3", "qemu-img"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let raw = image(dir.path(), "odd.raw", "1m:r 1m:- 1000:t");
    let s = raw.to_str().unwrap();
    to_qcow2(&raw, &dir.path().join("d.qcow2"), &[]);
    let server = PythonServer::start(dir.path());
    let url = format!("{}/odd.raw", server.url);
    // Padded to 512 as the file is: the file's checksum, not the pipe's.
    assert_eq!(checksum(&[&url]), checksum(&[s]));
    let err = fails(&[&format!("{}/d.qcow2", server.url)]);
    assert!(err.contains("does not answer range requests"), "{err}");
    let err = fails(&["-f", "qcow2", &url]);
    assert!(err.contains("does not answer range requests"), "{err}");
}

/// 1 MiB of pseudo-random bytes: more than the first request's 64 KiB.
fn data() -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The checksum of `data` as a file.
fn file_checksum(dir: &Path, data: &[u8]) -> String {
    let p: PathBuf = dir.join("same.img");
    std::fs::write(&p, data).unwrap();
    checksum(&[p.to_str().unwrap()])
}

#[test]
fn every_bad_server_is_an_error_naming_the_url() {
    let cases: &[(Misbehave, &[&str], &str)] = &[
        (Misbehave::NoContentRange, &[], "without Content-Range"),
        (Misbehave::WrongContentRange, &[], "the server sent bytes"),
        (
            Misbehave::ShortBody,
            &["--retries", "1"],
            "2 tries failed, the last: the reply ended after",
        ),
        (Misbehave::LongBody, &[], "Content-Length"),
        (Misbehave::EndlessBody, &[], "longer than the"),
        (
            Misbehave::Trickle,
            &["--timeout", "1", "--retries", "0"],
            "took more than 1 seconds",
        ),
        (
            Misbehave::Silent,
            &["--timeout", "1", "--retries", "0"],
            "1 try failed",
        ),
        (Misbehave::RedirectLoop, &[], "more than 10 redirects"),
        (Misbehave::HugeHeaders, &[], "larger than 64 KiB"),
        (Misbehave::Status(404), &[], "HTTP 404 Not Found"),
        (Misbehave::Status(403), &[], "HTTP 403 Forbidden"),
        (
            Misbehave::Status(500),
            &[],
            "HTTP 500 Internal Server Error",
        ),
        (
            Misbehave::Status(503),
            &["--retries", "2"],
            "3 tries failed, the last: HTTP 503",
        ),
        (Misbehave::ChangesAfter(3), &[], "changed while it was read"),
        (
            Misbehave::ChangesIgnoringConditions(3),
            &[],
            "changed while it was read: its ETag was \"v1\"",
        ),
        (Misbehave::Gzip, &[], "encoded the reply (gzip)"),
        (
            Misbehave::TwoLengths,
            &[],
            "two Content-Lengths that differ",
        ),
    ];
    for (how, opts, said) in cases {
        let server = Hostile::start(data(), *how);
        let args = [*opts, &["--read-size", "64k", &server.url]].concat();
        let err = fails(&args);
        assert!(
            err.contains(&server.url) && err.contains(said),
            "{how:?}: {err}"
        );
    }
}

/// Interim replies (1xx: `100 Continue`, `102 Processing`, `103 Early
/// Hints`) before each reply are read past, as RFC 9110 says a client
/// does, on both read paths: the ranges read on connections of our own,
/// and ureq's (the first request, and every one through a proxy); one
/// that switches protocols unasked, or interim replies that never end,
/// are refused for what they are (issue #57: "headers larger than 64
/// KiB" before).
#[test]
fn interim_replies_are_read_past() {
    let dir = tempfile::tempdir().unwrap();
    let want = file_checksum(dir.path(), &data());
    let proxy = ConnectProxy::start();
    let via = [("http_proxy", proxy.url.as_str())];
    for code in [100, 102, 103] {
        let server = Hostile::start(data(), Misbehave::Interim(code));
        for read_size in ["64k", "1m"] {
            let args = ["--read-size", read_size, &server.url];
            assert_eq!(checksum(&args), want, "{code} {read_size}");
            let through = proxy.count();
            assert_eq!(
                checksum_env(&args, &via),
                want,
                "{code} {read_size}, proxied"
            );
            assert!(proxy.count() > through);
        }
    }
    let server = Hostile::start(data(), Misbehave::Interim(101));
    for env in [&[][..], &via] {
        let err = fails_env(&[&server.url], env);
        assert!(
            err.contains(&server.url) && err.contains("switched protocols (101)"),
            "{env:?}: {err}"
        );
    }
    let server = Hostile::start(data(), Misbehave::EndlessInterim);
    for env in [&[][..], &via] {
        let err = fails_env(&["--retries", "0", "--timeout", "20", &server.url], env);
        assert!(
            err.contains(&server.url) && err.contains("more than 64 KiB of interim (1xx) replies"),
            "{env:?}: {err}"
        );
    }
}

#[test]
fn a_server_that_drops_every_third_connection_gives_the_same_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let want = file_checksum(dir.path(), &data());
    let server = Hostile::start(data(), Misbehave::DropEveryThird);
    // 16 reads of 64 KiB, each on a connection of its own at first.
    assert_eq!(checksum(&["--read-size", "64k", &server.url]), want);
    assert!(
        server
            .stats
            .connections
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 3
    );
    // A correct server: the same, and every range asked for conditionally.
    let server = Hostile::start(data(), Misbehave::Nothing);
    assert_eq!(checksum(&["--read-size", "64k", &server.url]), want);
    let heads = server.stats.heads.lock().unwrap();
    assert!(heads.len() > 1);
    for h in &heads[1..] {
        assert!(h.to_ascii_lowercase().contains("if-match: \"v1\""), "{h}");
    }
}

/// Ranges of a plain-HTTP file are read on connections of our own,
/// straight into the buffers hashed (blkimage's storage/http/direct.rs):
/// every request after the first (ureq's) is ours, on kept-alive
/// connections. A reply framed otherwise (chunked) is asked again through
/// ureq, and one that closes its connection is not waited for.
#[test]
fn ranges_are_read_on_connections_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let want = file_checksum(dir.path(), &data());
    let server = Hostile::start(data(), Misbehave::Nothing);
    let sum = |url: &str| checksum(&["--read-size", "64k", "--io-depth", "2", url]);
    assert_eq!(sum(&server.url), want);
    // How our requests begin (ureq's name their headers in lower case).
    let ours = |url: &str| {
        let host = url
            .trim_start_matches("http://")
            .trim_end_matches("/disk.img");
        format!("GET /disk.img HTTP/1.1\r\nHost: {host}\r\nUser-Agent: blkhash/")
    };
    let heads = server.stats.heads.lock().unwrap().clone();
    let ours_here = ours(&server.url);
    assert!(
        !heads[0].starts_with(&ours_here),
        "the first request is ureq's: {}",
        heads[0]
    );
    assert!(heads.len() > 8);
    for h in &heads[1..] {
        assert!(h.starts_with(&ours_here), "{h}");
    }
    let connections = server.stats.connections.load(Ordering::SeqCst);
    assert!(
        connections <= 4,
        "{connections} connections for {} requests",
        heads.len()
    );
    // Chunked: each range asked twice, ours first.
    let server = Hostile::start(data(), Misbehave::Chunked);
    assert_eq!(sum(&server.url), want);
    let chunked = server.stats.heads.lock().unwrap().clone();
    assert_eq!(chunked.len(), 2 * heads.len() - 1);
    let (by_us, by_ureq): (Vec<_>, Vec<_>) = chunked[1..]
        .iter()
        .partition(|h| h.starts_with(&ours(&server.url)));
    let range = |h: &&String| {
        h.to_ascii_lowercase()
            .split("range: ")
            .nth(1)
            .map(str::to_string)
    };
    let mut by_us: Vec<_> = by_us.iter().map(range).collect();
    let mut by_ureq: Vec<_> = by_ureq.iter().map(range).collect();
    by_us.sort();
    by_ureq.sort();
    assert_eq!(by_us.len(), heads.len() - 1);
    assert_eq!(by_us, by_ureq);
    // Connection: close: a connection for each range.
    let server = Hostile::start(data(), Misbehave::CloseEach);
    assert_eq!(sum(&server.url), want);
    assert_eq!(server.stats.requests.load(Ordering::SeqCst), heads.len());
    assert!(server.stats.connections.load(Ordering::SeqCst) >= heads.len());
}

#[test]
fn passwords_headers_and_redirects() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir_all(www.join("private")).unwrap();
    std::fs::create_dir_all(www.join("bearer")).unwrap();
    let raw = image(&www, "disk.raw", "1m:r 1m:- 100k:t");
    let want = checksum(&[raw.to_str().unwrap()]);
    std::fs::copy(&raw, www.join("private/disk.raw")).unwrap();
    std::fs::copy(&raw, www.join("bearer/disk.raw")).unwrap();
    std::fs::write(dir.path().join("htpasswd"), "me:{PLAIN}s3cret\n").unwrap();
    let locations = format!(
        "location /private/ {{ auth_basic \"x\"; auth_basic_user_file {}/htpasswd; }}\n\
         location /bearer/ {{ if ($http_authorization != \"Bearer t0k\") {{ return 401; }} }}\n\
         location = /moved.raw {{ return 302 /disk.raw; }}",
        dir.path().display()
    );
    let nginx = Nginx::start(&www, None, &locations);
    let port = nginx.port;
    let with_pw = format!("http://me:s3cret@127.0.0.1:{port}/private/disk.raw");
    let shown = format!("http://me:***@127.0.0.1:{port}/private/disk.raw");
    assert_eq!(sums(&[&with_pw]), format!("{want}  {shown}\n"));
    let json = sums(&["--json", &with_pw]);
    assert!(json.contains(&shown) && !json.contains("s3cret"), "{json}");
    let bad = with_pw.replace("s3cret", "wrong");
    let err = fails(&[&bad]);
    assert!(
        err.contains("http://me:***@") && err.contains("HTTP 401") && !err.contains("wrong"),
        "{err}"
    );
    let bearer = format!("{}/bearer/disk.raw", nginx.url);
    assert_eq!(
        checksum(&["--header", "Authorization: Bearer t0k", &bearer]),
        want
    );
    // 401 names the ways to pass credentials (issue #50).
    let err = fails(&[&bearer]);
    assert!(
        err.contains("HTTP 401 Unauthorized")
            && err.contains("--header 'Authorization: ...'")
            && err.contains("USER:PASSWORD@"),
        "{err}"
    );
    let err = run_timeout(&["--header", "Range: bytes=0-1", &bearer], None, LIMIT);
    assert_eq!(err.status.code(), Some(2), "{}", stderr(&err));
    // A redirect is followed, and ranges go to its target.
    assert_eq!(checksum(&[&format!("{}/moved.raw", nginx.url)]), want);
    let log = nginx.log();
    let moved: Vec<&Logged> = log.iter().filter(|l| l.uri == "/moved.raw").collect();
    assert_eq!(moved.len(), 1, "{log:?}");
}

/// A KubeVirt VirtualMachineExport as its users check one (issue #58):
/// nginx answering as the export server does (testkit's
/// `kubevirt_export_locations`: the token in a header or the query, HEAD
/// on the gzip form 400, ranges on disk.img), over TLS trusting the CA
/// bundle the export's `status.links.*.cert` gives (one PEM file, several
/// certificates); the token from a file (`--header @FILE`, as the export's
/// header secret holds it), never in an output line or message; disk.img
/// read by ranges, disk.img.gz as one stream without a HEAD (its bytes the
/// .gz file's with -f raw); a 401 naming the token header. And a server
/// that refuses the first range request (400) read as a stream.
#[test]
fn a_kubevirt_export_with_its_token_and_ca() {
    if !(ready() && require(&["certtool", "gzip", "curl"])) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("www/volumes/disk-pvc");
    std::fs::create_dir_all(&vol).unwrap();
    let img = image(&vol, "disk.img", "1m:r 2m:- 1m:t 700000:r");
    let gz = vol.join("disk.img.gz");
    let zipped = std::process::Command::new("gzip")
        .args(["-c", img.to_str().unwrap()])
        .output()
        .unwrap();
    std::fs::write(&gz, zipped.stdout).unwrap();
    let pki = testkit::nbd::make_pki(&dir.path().join("pki"));
    let bundle = dir.path().join("export-ca.pem");
    let pem = |p: &Path| std::fs::read_to_string(p.join("ca-cert.pem")).unwrap();
    std::fs::write(&bundle, pem(&pki.wrong_ca) + &pem(&pki.ca_only)).unwrap();
    let ca = ["--tls-certificates", bundle.to_str().unwrap()];
    let locations = testkit::http::kubevirt_export_locations("T0K3n")
        + "location = /strict.raw { if ($http_range) { return 400; } }";
    let nginx = tls_nginx(&dir.path().join("www"), &pki, None, &locations);
    let token = dir.path().join("token");
    std::fs::write(&token, "x-kubevirt-export-token:T0K3n\n").unwrap();
    let token = format!("@{}", token.display());
    let base = format!("{}/volumes/disk-pvc", nginx.url);
    let (img_url, gz_url) = (format!("{base}/disk.img"), format!("{base}/disk.img.gz"));
    let want = checksum(&[img.to_str().unwrap()]);
    let out = sums(&[&ca[..], &["--header", &token, &img_url]].concat());
    assert_eq!(out, format!("{want}  {img_url}\n"));
    assert!(fetched(&nginx.log(), "/volumes/disk-pvc/disk.img").len() > 1);
    let query = format!("{img_url}?x-kubevirt-export-token=T0K3n");
    assert_eq!(checksum(&[&ca[..], &[&query]].concat()), want);
    // The gzip form: the .gz file's bytes, one GET, no HEAD.
    let head = std::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-I",
            "--cacert",
        ])
        .arg(pki.ca_only.join("ca-cert.pem"))
        .args(["-H", "x-kubevirt-export-token: T0K3n", &gz_url])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&head.stdout), "400");
    nginx.clear_log();
    let gz_sum = checksum(&[&ca[..], &["--header", &token, "-f", "raw", &gz_url]].concat());
    assert_eq!(gz_sum, checksum(&["-f", "raw", gz.to_str().unwrap()]));
    let log = nginx.log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].status, 200, "{log:?}");
    assert_eq!(log[0].bytes, std::fs::metadata(&gz).unwrap().len());
    // No token, a wrong one: 401, naming the header and the file form.
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "x-kubevirt-export-token: nope\n").unwrap();
    let wrong = format!("@{}", wrong.display());
    for (args, url) in [(&[][..], &img_url), (&["--header", &wrong][..], &gz_url)] {
        let err = fails(&[&ca[..], args, &[url]].concat());
        assert!(
            err.contains(url.as_str())
                && err.contains("HTTP 401 Unauthorized")
                && err.contains("--header 'x-kubevirt-export-token: TOKEN', or --header @FILE"),
            "{err}"
        );
    }
    let json = sums(&[&ca[..], &["--json", "--header", &token, &img_url]].concat());
    assert!(!json.contains("T0K3n"), "{json}");
    // A headers file that is not one: refused naming it, never its lines.
    let bad = dir.path().join("bad");
    std::fs::write(&bad, "T0K3n\n").unwrap();
    let out = run_timeout(
        &["--header", &format!("@{}", bad.display()), &img_url],
        None,
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("line 1 is not a header") && !err.contains("T0K3n"),
        "{err}"
    );
    // A server that refuses the range request itself: one GET more.
    let strict = format!("{}/strict.raw", nginx.url);
    std::fs::copy(&img, dir.path().join("www/strict.raw")).unwrap();
    nginx.clear_log();
    assert_eq!(checksum(&[&ca[..], &[&strict]].concat()), want);
    let statuses: Vec<u16> = nginx.log().iter().map(|l| l.status).collect();
    assert_eq!(statuses, [400, 200]);
}

#[test]
fn https_never_redirects_to_http() {
    if !(ready() && require(&["certtool"])) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = testkit::nbd::make_pki(&dir.path().join("pki"));
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    image(&www, "disk.raw", "1m:r");
    let tls = tls_nginx(
        &www,
        &pki,
        None,
        "location = /plain.raw { return 302 http://127.0.0.1:9/disk.raw; }",
    );
    let url = format!("{}/plain.raw", tls.url);
    let err = fails(&["--tls-certificates", pki.ca_only.to_str().unwrap(), &url]);
    assert!(err.contains("from HTTPS to plain HTTP"), "{err}");
}

#[test]
fn a_checkpoint_of_a_url_records_its_version() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    let raw = image(&www, "disk.raw", "1m:r 1m:- 1m:r");
    let s = raw.to_str().unwrap();
    to_qcow2(&raw, &www.join("d.qcow2"), &[]);
    let nginx = Nginx::start(&www, None, "");
    let url = format!("{}/d.qcow2", nginx.url);
    let ck = dir.path().join("ck");
    let ck = ck.to_str().unwrap();
    let want = checksum(&[s]);
    assert_eq!(
        checksum(&["--checkpoint", ck, "--keep-checkpoint", &url]),
        want
    );
    let record = std::fs::read(ck).unwrap();
    let text = String::from_utf8_lossy(&record);
    assert!(text.contains(&format!("http {url} ")), "{text}");
    // Given again: the same checksum, nothing read but the checks.
    assert_eq!(
        checksum(&["--checkpoint", ck, "--keep-checkpoint", &url]),
        want
    );
    // Another version (nginx's ETag is its length and time): refused.
    let f = std::fs::File::options()
        .write(true)
        .open(www.join("d.qcow2"))
        .unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(5))
        .unwrap();
    drop(f);
    let err = fails(&["--checkpoint", ck, &url]);
    assert!(
        err.contains("another version") && err.contains("ETag"),
        "{err}"
    );
}

#[test]
fn unknown_schemes_are_named() {
    for (name, scheme) in [
        ("ndb://host/disk", "ndb"),
        ("ftp://u:pw@host/disk.raw", "ftp"),
    ] {
        let err = fails(&[name]);
        assert!(
            err.contains(&format!(
                "unknown URL scheme '{scheme}'; NBD URLs start with nbd://"
            )),
            "{err}"
        );
        assert!(
            !err.contains("No such file") && !err.contains(":pw@"),
            "{err}"
        );
    }
}

/// blksum ARGS with the environment `env` (proxies), which must succeed;
/// the checksum.
fn checksum_env(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = blksum();
    cmd.args(args).stdin(std::process::Stdio::null());
    for v in [
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
    ] {
        cmd.env_remove(v);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "blksum {args:?} {env:?}: {}",
        stderr(&out)
    );
    stdout(&out).split_whitespace().next().unwrap().to_string()
}

#[test]
fn proxies_from_the_environment_as_curl_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let want = file_checksum(dir.path(), &data());
    let server = Hostile::start(data(), Misbehave::Nothing);
    let proxy = ConnectProxy::start();
    let url = server.url.as_str();
    let p = proxy.url.as_str();
    assert_eq!(checksum_env(&[url], &[("http_proxy", p)]), want);
    let through = proxy.count();
    assert!(through >= 1);
    assert_eq!(checksum_env(&[url], &[("all_proxy", p)]), want);
    assert!(proxy.count() > through);
    let n = proxy.count();
    // no_proxy names the host (curl's rules), HTTP_PROXY in upper case is
    // not read for http (a CGI program's comes from a request header),
    // https_proxy is for https URLs.
    for env in [
        &[("http_proxy", p), ("no_proxy", "localhost,127.0.0.1")][..],
        &[("all_proxy", p), ("NO_PROXY", "*")],
        &[("HTTP_PROXY", p)],
        &[("https_proxy", p)],
    ] {
        assert_eq!(checksum_env(&[url], env), want, "{env:?}");
        assert_eq!(proxy.count(), n, "{env:?}");
    }
}

/// blksum ARGS with the environment `env` (proxies), which must fail with
/// exit 1, no checksum and no panic; its stderr.
fn fails_env(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = blksum();
    cmd.args(args).stdin(std::process::Stdio::null());
    for v in ["http_proxy", "https_proxy", "all_proxy", "no_proxy"] {
        cmd.env_remove(v).env_remove(v.to_uppercase());
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "blksum {args:?} {env:?}: {err}");
    assert!(out.stdout.is_empty(), "checksum printed: {}", stdout(&out));
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// SOCKS proxies as curl takes them (socks4, socks4a, socks5, socks5h and
/// socks for SOCKS5) carry the requests; when a proxy refuses, the error
/// names the proxy. ureq without its socks-proxy feature panicked (exit
/// 101) on every one of them.
#[test]
fn socks_proxies_from_the_environment() {
    if !testkit::socks::have_socks() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let want = file_checksum(dir.path(), &data());
    let server = Hostile::start(data(), Misbehave::Nothing);
    let socks = testkit::socks::Socks::start();
    let url = server.url.as_str();
    for scheme in ["socks4", "socks4a", "socks5", "socks5h", "socks"] {
        let p = format!("{scheme}://{}", socks.addr);
        for var in ["http_proxy", "all_proxy"] {
            let before = socks.tunnels();
            assert_eq!(checksum_env(&[url], &[(var, &p)]), want, "{var}={p}");
            assert!(socks.tunnels() > before, "{var}={p}: not through the proxy");
        }
    }
    // The proxy cannot reach the server: a port nobody listens on.
    let closed = format!("http://127.0.0.1:{}/disk.raw", testkit::nbd::free_port());
    for scheme in ["socks4", "socks5", "socks5h"] {
        let p = format!("{scheme}://{}", socks.addr);
        let err = fails_env(&[&closed], &[("all_proxy", &p)]);
        assert!(
            err.contains(&format!("through the proxy {p} (from all_proxy)")),
            "{err}"
        );
    }
    // No proxy listening: the proxy refused, not the server.
    let nobody = format!("socks5://u:secret@127.0.0.1:{}", testkit::nbd::free_port());
    let err = fails_env(&[url], &[("http_proxy", &nobody)]);
    let shown = nobody.replace(":secret@", ":***@");
    assert!(
        err.contains(&format!(
            "cannot connect to the proxy {shown} (from http_proxy)"
        )),
        "{err}"
    );
    assert!(!err.contains("secret"), "{err}");
    // An https proxy for an http URL: TLS to the proxy, refused cleanly
    // (the SOCKS port does not speak TLS), no panic for want of a crypto
    // provider.
    let tls = format!("https://{}", socks.addr);
    let err = fails_env(&["--retries", "0", url], &[("http_proxy", &tls)]);
    assert!(
        err.contains(&format!("through the proxy {tls} (from http_proxy)")),
        "{err}"
    );
}

/// `user:password@` in the URL and an Authorization header: refused before
/// any request (both were sent, two Authorization headers the server took
/// as it pleased).
#[test]
fn credentials_in_the_url_and_an_authorization_header_are_refused() {
    let server = Hostile::start(data(), Misbehave::Nothing);
    let url = server.url.replace("http://", "http://me:s3cret@");
    for header in ["Authorization: Bearer t0k", "authorization: Basic eDp5"] {
        let err = fails(&["--header", header, &url]);
        assert!(
            err.contains(
                "the URL's user:password and an Authorization header both give credentials"
            ),
            "{err}"
        );
        assert!(err.contains("me:***@") && !err.contains("s3cret"), "{err}");
    }
    assert!(server.stats.heads.lock().unwrap().is_empty());
    // Either alone is sent once.
    checksum(&[&url]);
    checksum(&["--header", "Authorization: Bearer t0k", &server.url]);
    for h in server.stats.heads.lock().unwrap().iter() {
        let n = h.to_ascii_lowercase().matches("\r\nauthorization:").count();
        assert_eq!(n, 1, "{h}");
    }
}

/// virtnbdbackup's streams published over HTTP (written by its own
/// writer: the seeds of fuzz/seeds/vnbd/): a full stream, an incremental
/// one read over the full stream fetched beside it, an lz4 one; each the
/// checksum of the same file read here, not of its bytes. Without the full
/// stream the chain has a gap, named; a server without ranges refuses a
/// stream rather than hash its bytes.
#[test]
fn virtnbdbackup_streams_over_http() {
    if !have_nginx() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/vnbd");
    let www = dir.path().join("www");
    std::fs::create_dir_all(www.join("lz4")).unwrap();
    let files = [
        ("seed-plain", "sda.full.data"),
        ("seed-inc", "sda.inc.virtnbdbackup.1.data"),
        ("seed-lz4-chunked", "lz4/sda.full.data"),
    ];
    for (seed, name) in files {
        std::fs::copy(seeds.join(seed), www.join(name)).unwrap();
    }
    let nginx = Nginx::start(&www, None, "");
    for (_, name) in files {
        let local = www.join(name);
        let local = local.to_str().unwrap();
        let url = format!("{}/{name}", nginx.url);
        let want = checksum(&[local]);
        assert_eq!(checksum(&[&url]), want, "{url}");
        assert_ne!(
            checksum(&["-f", "raw", local]),
            want,
            "{name} read as a stream"
        );
    }
    let inc = format!("{}/sda.inc.virtnbdbackup.1.data", nginx.url);
    std::fs::remove_file(www.join("sda.full.data")).unwrap();
    let err = fails(&[&inc]);
    assert!(
        err.contains(&format!("virtnbdbackup stream '{inc}': a gap in the chain")),
        "{err}"
    );
    let server = PythonServer::start(&www);
    let err = fails(&[&format!("{}/lz4/sda.full.data", server.url)]);
    assert!(
        err.contains("does not answer range requests")
            && err.contains("the file is a virtnbdbackup stream"),
        "{err}"
    );
}
