//! NBD test servers: qemu-nbd and nbdkit started on a unix socket or a free
//! TCP port on 127.0.0.1, killed and waited for when dropped; x509
//! credentials for the TLS tests.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server, stopped when dropped.
pub struct Server {
    child: Child,
    /// The socket file, for unix sockets (removed when dropped).
    pub socket: Option<PathBuf>,
    /// The URL clients connect to.
    pub url: String,
}

impl Server {
    /// The process id (to kill it mid-transfer).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How the server ended, if it has (`None`: still running): what a
    /// test says when a client could not connect.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Kill the server now (SIGKILL) and wait for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Ask the server to end (SIGTERM) and wait for it, killing it after
    /// 10 s. Not SIGKILL first: nbdkit's sh plugin keeps its scripts in a
    /// directory of its own under /tmp (whatever TMPDIR says), which only
    /// an orderly exit removes.
    fn stop(&mut self) {
        crate::tools::terminate(&mut self.child);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        if let Some(s) = &self.socket {
            let _ = std::fs::remove_file(s);
        }
    }
}

/// Where a server listens.
pub enum Listen<'a> {
    /// A unix socket at this path.
    Unix(&'a Path),
    /// A free TCP port on 127.0.0.1.
    Tcp,
}

/// A TCP port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn url(listen: &Listen, port: u16, export: &str) -> String {
    match listen {
        Listen::Unix(p) => format!("nbd+unix:///{export}?socket={}", p.display()),
        Listen::Tcp => format!("nbd://127.0.0.1:{port}/{export}"),
    }
}

/// The TLS form of a plain NBD URL (nbds://, nbds+unix://).
pub fn tls_url(url: &str) -> String {
    url.replacen("nbd", "nbds", 1)
}

/// Spawn the server `cmd` listening on `listen` (`port` if TCP) and wait
/// until it is ready; its URL names `export`.
fn start(mut cmd: Command, listen: Listen, port: u16, export: &str) -> Server {
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{:?} runs: {e}", cmd.get_program()));
    wait_ready(&mut child, &listen, port);
    let socket = match listen {
        Listen::Unix(p) => Some(p.to_path_buf()),
        Listen::Tcp => None,
    };
    Server {
        url: url(&listen, port, export),
        child,
        socket,
    }
}

/// Wait until the server greets a client. A connection alone proves
/// nothing: qemu-nbd listens before it opens the image and takes its locks
/// (strace: listen(), then open and F_OFD_SETLK), and the kernel accepts
/// connections into the backlog meanwhile; the greeting comes once the
/// export is set up. The deadline is for a server that never starts, far
/// above a loaded machine's start.
fn wait_ready(child: &mut Child, listen: &Listen, port: u16) {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            panic!("server exited early: {s}");
        }
        let ready = match listen {
            Listen::Unix(p) => std::os::unix::net::UnixStream::connect(p)
                .is_ok_and(|s| s.set_read_timeout(Some(GREETING_WAIT)).is_ok() && greets(s)),
            Listen::Tcp => std::net::TcpStream::connect(("127.0.0.1", port))
                .is_ok_and(|s| s.set_read_timeout(Some(GREETING_WAIT)).is_ok() && greets(s)),
        };
        if ready {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "server did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How long one probe waits for a greeting before trying again.
const GREETING_WAIT: Duration = Duration::from_secs(2);

/// Whether the server on `s` sends the newstyle greeting (NBDMAGIC,
/// IHAVEOPT, its flags); the probe then leaves as the protocol asks
/// (NBD_OPT_ABORT), so that the server logs no error and frees its slot.
fn greets(mut s: impl Read + Write) -> bool {
    let mut greeting = [0u8; 18];
    if s.read_exact(&mut greeting).is_err() || &greeting[..16] != b"NBDMAGICIHAVEOPT" {
        return false;
    }
    let mut abort = Vec::with_capacity(20);
    abort.extend(1u32.to_be_bytes()); // NBD_FLAG_C_FIXED_NEWSTYLE
    abort.extend(b"IHAVEOPT");
    abort.extend(2u32.to_be_bytes()); // NBD_OPT_ABORT
    abort.extend(0u32.to_be_bytes()); // no data
    let _ = s.write_all(&abort);
    // The server's acknowledgement, or its close: either ends the probe.
    let _ = s.read(&mut [0u8; 20]);
    true
}

/// `qemu-nbd --read-only -f FMT [-x NAME] IMG` (persistent: several
/// clients, one after another, and multi-conn).
pub fn qemu_nbd(img: &Path, fmt: &str, listen: Listen, export: Option<&str>) -> Server {
    qemu_nbd_with(img, fmt, listen, export, &READ_ONLY)
}

/// The arguments of a read-only qemu-nbd that serves several clients at
/// once (and so offers multi-conn).
const READ_ONLY: [&str; 2] = ["--read-only", "--shared=8"];

/// `qemu-nbd` serving `img` over TLS with the x509 credentials in `dir`
/// (ca-cert.pem, server-cert.pem, server-key.pem); `verify_peer`: clients
/// must show a certificate from the CA. The URL is nbds:// or nbds+unix://.
pub fn qemu_nbd_tls(img: &Path, listen: Listen, dir: &Path, verify_peer: bool) -> Server {
    let creds = format!(
        "tls-creds-x509,id=tls0,endpoint=server,dir={},verify-peer={}",
        dir.display(),
        if verify_peer { "on" } else { "off" }
    );
    let mut args = READ_ONLY.to_vec();
    args.extend(["--object", &creds, "--tls-creds=tls0"]);
    let mut srv = qemu_nbd_with(img, "raw", listen, None, &args);
    srv.url = tls_url(&srv.url);
    srv
}

/// `qemu-nbd --persistent -f FMT [-x NAME] EXTRA... IMG` (writable unless
/// `extra` says `--read-only`).
pub fn qemu_nbd_with(
    img: &Path,
    fmt: &str,
    listen: Listen,
    export: Option<&str>,
    extra: &[&str],
) -> Server {
    let port = free_port();
    let mut cmd = Command::new("qemu-nbd");
    cmd.args(["--persistent", "-f", fmt]);
    match &listen {
        Listen::Unix(p) => cmd.arg(format!("--socket={}", p.display())),
        Listen::Tcp => cmd.args(["--bind=127.0.0.1", &format!("--port={port}")]),
    };
    if let Some(x) = export {
        cmd.args(["-x", x]);
    }
    cmd.args(extra).arg(img);
    start(cmd, listen, port, export.unwrap_or(""))
}

/// x509 credentials for TLS tests, made with certtool (gnutls-bin): one
/// directory per role, laid out as QEMU, nbdkit and libnbd expect.
pub struct Pki {
    /// ca-cert.pem, server-cert.pem (localhost and 127.0.0.1), server-key.pem.
    pub server: PathBuf,
    /// ca-cert.pem, client-cert.pem, client-key.pem.
    pub client: PathBuf,
    /// ca-cert.pem only: no client certificate.
    pub ca_only: PathBuf,
    /// ca-cert.pem of another CA, which signed nothing here.
    pub wrong_ca: PathBuf,
}

fn certtool(args: &[&str], dir: &Path) {
    let out = Command::new("certtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("certtool runs (gnutls-bin)");
    assert!(
        out.status.success(),
        "certtool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A private key (RSA: QEMU wants the server's key usable for encipherment).
fn private_key(dir: &Path, name: &str) {
    certtool(
        &[
            "--generate-privkey",
            "--key-type=rsa",
            "--bits=2048",
            "--no-text",
            "--outfile",
            name,
        ],
        dir,
    );
}

/// A CA: ca-key.pem and ca-cert.pem in `dir`.
fn make_ca(dir: &Path, name: &str) {
    std::fs::create_dir_all(dir).unwrap();
    private_key(dir, "ca-key.pem");
    std::fs::write(
        dir.join("ca.info"),
        format!("cn = {name}\nca\ncert_signing_key\nexpiration_days = 2\n"),
    )
    .unwrap();
    certtool(
        &[
            "--generate-self-signed",
            "--load-privkey=ca-key.pem",
            "--template=ca.info",
            "--no-text",
            "--outfile=ca-cert.pem",
        ],
        dir,
    );
}

/// A certificate `name`-cert.pem signed by the CA in `ca`, written in `dir`.
fn make_cert(ca: &Path, dir: &Path, name: &str, template: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(ca.join("ca-cert.pem"), dir.join("ca-cert.pem")).unwrap();
    private_key(dir, &format!("{name}-key.pem"));
    std::fs::write(dir.join(format!("{name}.info")), template).unwrap();
    certtool(
        &[
            "--generate-certificate",
            &format!("--load-ca-certificate={}", ca.join("ca-cert.pem").display()),
            &format!("--load-ca-privkey={}", ca.join("ca-key.pem").display()),
            &format!("--load-privkey={name}-key.pem"),
            &format!("--template={name}.info"),
            "--no-text",
            &format!("--outfile={name}-cert.pem"),
        ],
        dir,
    );
}

/// Make a CA, a server and a client certificate, and another CA, in `dir`.
pub fn make_pki(dir: &Path) -> Pki {
    let ca = dir.join("ca");
    make_ca(&ca, "blkhash test CA");
    let pki = Pki {
        server: dir.join("server"),
        client: dir.join("client"),
        ca_only: dir.join("ca-only"),
        wrong_ca: dir.join("wrong-ca"),
    };
    make_cert(
        &ca,
        &pki.server,
        "server",
        "cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\n\
         tls_www_server\nencryption_key\nsigning_key\nexpiration_days = 2\n",
    );
    make_cert(
        &ca,
        &pki.client,
        "client",
        "cn = blkhash test client\ntls_www_client\nencryption_key\nsigning_key\n\
         expiration_days = 2\n",
    );
    std::fs::create_dir_all(&pki.ca_only).unwrap();
    std::fs::copy(ca.join("ca-cert.pem"), pki.ca_only.join("ca-cert.pem")).unwrap();
    make_ca(&pki.wrong_ca, "another CA");
    pki
}

/// `nbdkit --foreground ARGS` (plugin, filters and parameters in ARGS).
pub fn nbdkit(listen: Listen, args: &[&str]) -> Server {
    let port = free_port();
    let mut cmd = Command::new("nbdkit");
    cmd.args(["--foreground", "--exit-with-parent"]);
    match &listen {
        Listen::Unix(p) => cmd.arg(format!("--unix={}", p.display())),
        Listen::Tcp => cmd.args(["--ipaddr=127.0.0.1", &format!("--port={port}")]),
    };
    cmd.args(args).stderr(Stdio::null());
    start(cmd, listen, port, "")
}

/// What QEMU reads from `url`, as a raw file `out`.
pub fn fetch(url: &str, out: &Path) {
    crate::tools::qemu_img(&[
        "convert",
        "-q",
        "-f",
        "raw",
        url,
        "-O",
        "raw",
        out.to_str().unwrap(),
    ]);
}

/// Processes whose command line contains `needle`.
pub fn processes_with(needle: &str) -> Vec<String> {
    let out = Command::new("pgrep")
        .args(["-af", needle])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("pgrep"))
        .map(String::from)
        .collect()
}
