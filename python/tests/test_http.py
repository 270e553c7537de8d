"""checksum() and map_range() of HTTPS URLs: a real nginx with TLS
(certificates made here with certtool), a bearer token in headers=, and
the errors (a password never shown, a missing file's errno class)."""

import os
import shutil
import socket
import subprocess
import time

import pytest

import blkhash
from conftest import need, write_image

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def certtool(args, cwd):
    subprocess.run(["certtool", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d):
    """A CA, a server certificate for localhost and 127.0.0.1, as QEMU lays
    them out (ca-cert.pem, server-cert.pem, server-key.pem)."""
    d.mkdir()
    for name in ("ca-key.pem", "server-key.pem"):
        certtool(["--generate-privkey", "--key-type=rsa", "--bits=2048", "--no-text",
                  "--outfile", name], d)
    (d / "ca.info").write_text("cn = test CA\nca\ncert_signing_key\nexpiration_days = 2\n")
    certtool(["--generate-self-signed", "--load-privkey=ca-key.pem", "--template=ca.info",
              "--no-text", "--outfile=ca-cert.pem"], d)
    (d / "server.info").write_text("cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\n"
                                   "tls_www_server\nencryption_key\nsigning_key\n"
                                   "expiration_days = 2\n")
    certtool(["--generate-certificate", "--load-ca-certificate=ca-cert.pem",
              "--load-ca-privkey=ca-key.pem", "--load-privkey=server-key.pem",
              "--template=server.info", "--no-text", "--outfile=server-cert.pem"], d)
    return d


@pytest.fixture
def https(tmp_path):
    """nginx serving tmp_path/www over TLS on a free port: (url, www, pki)."""
    if NGINX is None:
        pytest.skip("nginx missing (scripts/setup.sh installs it)")
    need("certtool", "gnutls-bin")
    pki = make_pki(tmp_path / "pki")
    www = tmp_path / "www"
    (www / "bearer").mkdir(parents=True)
    conf = tmp_path / "nginx"
    (conf / "tmp").mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (conf / "nginx.conf").write_text(
        f"daemon off;\nmaster_process off;\npid {conf}/pid;\nerror_log {conf}/error.log;\n"
        f"events {{}}\nhttp {{\n access_log off;\n client_body_temp_path {conf}/tmp;\n"
        f" proxy_temp_path {conf}/tmp;\n fastcgi_temp_path {conf}/tmp;\n"
        f" uwsgi_temp_path {conf}/tmp;\n scgi_temp_path {conf}/tmp;\n"
        f" server {{\n  listen 127.0.0.1:{port} ssl;\n"
        f"  ssl_certificate {pki}/server-cert.pem;\n  ssl_certificate_key {pki}/server-key.pem;\n"
        f"  root {www};\n"
        f"  location /bearer/ {{ if ($http_authorization != \"Bearer t0k\") {{ return 401; }} }}\n"
        f" }}\n}}\n")
    proc = subprocess.Popen([NGINX, "-c", str(conf / "nginx.conf"), "-p", str(conf)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "nginx exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.01)
        yield f"https://localhost:{port}", www, pki
    finally:
        proc.kill()
        proc.wait()


def test_checksum_of_an_https_url_is_the_file_s(https, tmp_path):
    url, www, pki = https
    raw = www / "disk.raw"
    write_image("1m:r 1m:- 1m:t 1000:r", raw)
    qcow2 = www / "disk.qcow2"
    subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(qcow2)],
                   check=True)
    for name in ("disk.raw", "disk.qcow2"):
        with pytest.warns(UserWarning) if name == "disk.raw" else _nothing():
            want = blkhash.checksum(www / name, digest="blake3")
        with pytest.warns(UserWarning) if name == "disk.raw" else _nothing():
            got = blkhash.checksum(f"{url}/{name}", digest="blake3", tls_certificates=pki)
        assert got == want, name
    # A bearer token in headers=.
    os.link(qcow2, www / "bearer" / "disk.qcow2")
    want = blkhash.checksum(qcow2)
    assert blkhash.checksum(f"{url}/bearer/disk.qcow2", tls_certificates=pki,
                            headers={"Authorization": "Bearer t0k"}) == want
    with pytest.raises(OSError, match="HTTP 401"):
        blkhash.checksum(f"{url}/bearer/disk.qcow2", tls_certificates=pki, retries=0)
    # map_range() of a URL: its part merges into the file's checksum.
    part = tmp_path / "part"
    assert blkhash.map_range(f"{url}/disk.qcow2", part, tls_certificates=pki) == \
        (0, 3 * 1024 * 1024 + 512 * 2)
    assert blkhash.merge([part]) == want


def test_errors_name_the_url_without_its_password(https):
    url, www, pki = https
    secret = url.replace("https://", "https://me:s3cret@") + "/missing.raw"
    with pytest.raises(OSError) as e:
        blkhash.checksum(secret, tls_certificates=pki)
    assert "me:***@" in str(e.value) and "s3cret" not in str(e.value)
    assert "HTTP 404" in str(e.value)
    with pytest.raises(OSError, match="certificate verify failed"):
        blkhash.checksum(url + "/missing.raw")
    with pytest.raises(ValueError, match="own to set"):
        blkhash.checksum(url + "/x", headers={"Range": "bytes=0-1"})
    with pytest.raises(ValueError, match="retries"):
        blkhash.checksum(url + "/x", retries=-1)
    with pytest.raises(OSError, match="unknown URL scheme 'ndb'"):
        blkhash.checksum("ndb://host/x")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_bitmap_functions_take_headers_retries_and_a_ca_file(https, tmp_path):
    """bitmaps(), dirty_ranges() and update_map() of a protected URL, as
    checksum() reads it (issue #50): headers=, retries=, a CA's file."""
    url, www, pki = https
    img = www / "bearer" / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(img), "8M"], check=True)
    subprocess.run(["qemu-io", "-c", "write -P 0x11 0 4M", str(img)], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["qemu-img", "bitmap", "--add", str(img), "b"], check=True)
    remote = f"{url}/bearer/disk.qcow2"
    auth = {"headers": {"Authorization": "Bearer t0k"}, "retries": 1,
            "tls_certificates": pki / "ca-cert.pem"}
    part, base = tmp_path / "part", tmp_path / "base.map"
    blkhash.map_range(remote, part, **auth)
    blkhash.merge([part], base)
    subprocess.run(["qemu-io", "-c", "write -P 0x22 1M 64k", str(img)], check=True,
                   stdout=subprocess.DEVNULL)
    assert [b["name"] for b in blkhash.bitmaps(remote, **auth)] == ["b"]
    assert blkhash.dirty_ranges(remote, "b", **auth) == [(1024 * 1024, 65536)]
    # A file changed on the server is another version: the bitmap cannot
    # say what changed, and the way out is named.
    out = tmp_path / "now.map"
    with pytest.raises(OSError, match=r"another version.*map_range\(\) makes a full map"):
        blkhash.update_map(remote, base, "b", out, **auth)
    blkhash.map_range(remote, part, **auth)
    blkhash.merge([part], base)
    assert blkhash.update_map(remote, base, "b", out, **auth) == blkhash.checksum(img)
    # Without the token: the keyword that passes it is named.
    for call in (lambda: blkhash.bitmaps(remote, tls_certificates=pki),
                 lambda: blkhash.dirty_ranges(remote, "b", tls_certificates=pki)):
        with pytest.raises(OSError, match=r"HTTP 401 .*headers=\{'Authorization'"):
            call()
    # An unknown CA: the keyword and SSL_CERT_FILE are named.
    with pytest.raises(OSError, match=r"SSL_CERT_FILE.*tls_certificates="):
        blkhash.bitmaps(remote, **{**auth, "tls_certificates": None})
    # The keywords are checked as in a signature.
    with pytest.raises(TypeError, match="unexpected keyword argument 'header'"):
        blkhash.bitmaps(remote, header={})
    with pytest.raises(TypeError, match="unexpected keyword argument 'cache'"):
        blkhash.dirty_ranges(remote, "b", cache=True)
    with pytest.raises(TypeError, match="argument 'no_backing'"):
        blkhash.checksum(remote, no_backing="yes")
