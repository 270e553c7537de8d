//! NBD over TLS (nbds://, nbds+unix://) against real qemu-nbd and nbdkit
//! servers with x509 credentials made here by certtool: the checksum equals
//! the file's; a wrong CA, a missing client certificate, a server that wants
//! TLS while the URL is plain (and the reverse) are errors that name the
//! URL, exit 1, and print no checksum.

use crate::common;

use common::nbd::*;
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// A few raw recipes: holes, zeros, data, a tail not a multiple of 512,
/// and 16 MiB of data (many requests in flight, several connections).
const RECIPES: &[&str] = &[
    "1m:A 127m:- 1m:B 127m:- 1m:C 63m:-",
    "1m:r 1m:- 1m:0 1m:t 100000:r",
    "8m:t 8m:- 8m:r 8m:0",
];

/// The sha256, 64k vectors of RECIPES (checksums of the files).
fn vectors() -> Vec<testkit::Vector> {
    testkit::vectors()
        .into_iter()
        .filter(|v| {
            v.format.is_none()
                && v.digest == "sha256"
                && v.block_size == 65536
                && RECIPES.contains(&v.recipe.as_str())
        })
        .collect()
}

/// The vector of one of RECIPES.
fn vector(recipe: &str) -> testkit::Vector {
    vectors().into_iter().find(|v| v.recipe == recipe).unwrap()
}

/// nbd_fails, and the error names `url`.
fn fails(args: &[&str], url: &str) -> String {
    let err = nbd_fails(args);
    assert!(err.contains(url), "{err}");
    err
}

fn have_tls_tools() -> bool {
    require(&["qemu-nbd", "certtool"])
}

fn with_certs(url: &str, dir: &Path) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}tls-certificates={}", dir.display())
}

#[test]
fn qemu_nbd_tls_over_tcp_and_unix_sockets() {
    if !have_tls_tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let vs = vectors();
    assert_eq!(vs.len(), RECIPES.len());
    for (i, v) in vs.iter().enumerate() {
        let img = image(dir.path(), &format!("{i}.raw"), &v.recipe);
        // TCP, the server's certificate checked for 127.0.0.1; the
        // certificates directory from the option, then from the URL.
        let srv = qemu_nbd_tls(&img, Listen::Tcp, &pki.server, false);
        assert!(srv.url.starts_with("nbds://127.0.0.1:"), "{}", srv.url);
        let ca = pki.ca_only.to_str().unwrap();
        assert_eq!(
            nbd_sum(&["--tls-certificates", ca, &srv.url]),
            v.file,
            "{}",
            v.recipe
        );
        // The CA's file itself, as curl's --cacert takes it.
        let ca_file = pki.ca_only.join("ca-cert.pem");
        assert_eq!(
            nbd_sum(&["--tls-certificates", ca_file.to_str().unwrap(), &srv.url]),
            v.file
        );
        // ... and for localhost, a name.
        let by_name = srv.url.replace("127.0.0.1", "localhost");
        assert_eq!(nbd_sum(&[&with_certs(&by_name, &pki.ca_only)]), v.file);
        drop(srv);
        // A unix socket: the certificate checked for "localhost".
        let sock = dir.path().join(format!("{i}.sock"));
        let srv = qemu_nbd_tls(&img, Listen::Unix(&sock), &pki.server, false);
        assert!(srv.url.starts_with("nbds+unix://"), "{}", srv.url);
        assert_eq!(nbd_sum(&[&with_certs(&srv.url, &pki.ca_only)]), v.file);
        // Another digest and block size, as hashing the file gives.
        let expect = nbd_sum(&["-d", "blake3", "--block-size", "4k", img.to_str().unwrap()]);
        assert_eq!(
            nbd_sum(&[
                "-d",
                "blake3",
                "--block-size",
                "4k",
                "--tls-certificates",
                ca,
                &srv.url
            ]),
            expect
        );
    }
}

#[test]
fn qemu_nbd_tls_with_client_certificates() {
    if !have_tls_tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let v = &vector(RECIPES[2]);
    let img = image(dir.path(), "a.raw", &v.recipe);
    // verify-peer=on: the server wants a certificate from its CA.
    let srv = qemu_nbd_tls(&img, Listen::Tcp, &pki.server, true);
    assert_eq!(nbd_sum(&[&with_certs(&srv.url, &pki.client)]), v.file);
    let sock = dir.path().join("a.sock");
    let srv_unix = qemu_nbd_tls(&img, Listen::Unix(&sock), &pki.server, true);
    assert_eq!(nbd_sum(&[&with_certs(&srv_unix.url, &pki.client)]), v.file);
    // Without one: refused, and the error says what is missing.
    for url in [&srv.url, &srv_unix.url] {
        let url = with_certs(url, &pki.ca_only);
        let err = fails(&[&url], &url);
        assert!(err.contains("client certificate"), "{err}");
    }
}

#[test]
fn tls_errors_name_the_url_and_print_no_checksum() {
    if !have_tls_tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let img = image(dir.path(), "a.raw", "1m:r 1m:- 1m:t");
    let srv = qemu_nbd_tls(&img, Listen::Tcp, &pki.server, false);
    // A CA that did not sign the server's certificate.
    let url = with_certs(&srv.url, &pki.wrong_ca);
    let err = fails(&[&url], &url);
    assert!(err.contains("certificate verify failed"), "{err}");
    // No such directory, or no ca-cert.pem in it.
    let none = dir.path().join("none");
    let url = with_certs(&srv.url, &none);
    let err = fails(&[&url], &url);
    assert!(err.contains("ca-cert.pem"), "{err}");
    let err = fails(
        &["--tls-certificates", dir.path().to_str().unwrap(), &srv.url],
        &srv.url,
    );
    assert!(err.contains("ca-cert.pem"), "{err}");
    // A host name the certificate is not for.
    let sock = dir.path().join("a.sock");
    let srv_unix = qemu_nbd_tls(&img, Listen::Unix(&sock), &pki.server, false);
    let url = format!(
        "{}&tls-hostname=nbd.example",
        with_certs(&srv_unix.url, &pki.ca_only)
    );
    let err = fails(&[&url], &url);
    assert!(
        err.contains("certificate verify failed") && err.contains("nbd.example"),
        "{err}"
    );
    // A plain URL to a server that requires TLS.
    let plain = srv.url.replacen("nbds", "nbd", 1);
    let err = fails(&[&plain], &plain);
    assert!(err.contains("server requires TLS: use nbds://"), "{err}");
    let plain = srv_unix.url.replacen("nbds", "nbd", 1);
    let err = fails(&[&plain], &plain);
    assert!(
        err.contains("server requires TLS: use nbds+unix://"),
        "{err}"
    );
    // A TLS URL to a server without TLS.
    let srv_plain = qemu_nbd(&img, "raw", Listen::Tcp, None);
    let url = with_certs(&tls_url(&srv_plain.url), &pki.ca_only);
    let err = fails(&[&url], &url);
    assert!(err.contains("refused TLS"), "{err}");
    // The servers still serve: nothing above broke them.
    let expect = nbd_sum(&[img.to_str().unwrap()]);
    assert_eq!(nbd_sum(&[&with_certs(&srv.url, &pki.ca_only)]), expect);
    assert_eq!(nbd_sum(&[&srv_plain.url]), expect);
}

/// nbdkit's TLS (gnutls), if this nbdkit has it.
fn nbdkit_has_tls() -> bool {
    let out = std::process::Command::new("nbdkit")
        .arg("--dump-config")
        .output();
    matches!(out, Ok(o) if String::from_utf8_lossy(&o.stdout).lines().any(|l| l == "tls=yes"))
}

#[test]
fn nbdkit_tls_and_a_silent_tls_server() {
    if !(have("nbdkit") && have("certtool") && nbdkit_has_tls()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let v = &vector(RECIPES[1]);
    let img = image(dir.path(), "a.raw", &v.recipe);
    let f = img.to_str().unwrap();
    let certs = format!("--tls-certificates={}", pki.server.display());
    // nbdkit exports a file's exact size: the pipe checksum.
    let sock = dir.path().join("a.sock");
    let srv = nbdkit(Listen::Unix(&sock), &["--tls=require", &certs, "file", f]);
    let url = with_certs(&tls_url(&srv.url), &pki.ca_only);
    assert_eq!(nbd_sum(&[&url]), v.pipe_checksum());
    // TCP, and a client certificate required (tls-verify-peer).
    let srv = nbdkit(
        Listen::Tcp,
        &["--tls=require", &certs, "--tls-verify-peer", "file", f],
    );
    let url = with_certs(&tls_url(&srv.url), &pki.client);
    assert_eq!(nbd_sum(&[&url]), v.pipe_checksum());
    // A plain URL.
    let err = fails(&[&srv.url], &srv.url);
    assert!(err.contains("server requires TLS: use nbds://"), "{err}");
    // A server that stops answering: the timeout holds over TLS too.
    let sock = dir.path().join("slow.sock");
    let srv = nbdkit(
        Listen::Unix(&sock),
        &[
            "--tls=require",
            &certs,
            "--filter=delay",
            "file",
            f,
            "rdelay=20",
        ],
    );
    let url = with_certs(&tls_url(&srv.url), &pki.ca_only);
    let start = Instant::now();
    let err = fails(&["--timeout", "1", &url], &url);
    assert!(err.contains("did not answer"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(15));
}
