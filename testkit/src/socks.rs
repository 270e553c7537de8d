//! A SOCKS proxy for the tests: Dante's server (`danted`, Debian's
//! dante-server), which speaks SOCKS4, SOCKS4a and SOCKS5 as curl and
//! ureq do, on a free port of 127.0.0.1, relaying to 127.0.0.1 only.

use std::process::{Child, Command, Stdio};

/// True if danted is installed; else says the test is skipped.
pub fn have_socks() -> bool {
    let found = crate::tools::sbin_binary("danted").is_some();
    if !found {
        eprintln!("danted missing: test skipped (scripts/setup.sh installs dante-server)");
    }
    found
}

/// A running danted, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Socks {
    child: Child,
    dir: tempfile::TempDir,
    /// `127.0.0.1:PORT`: a proxy URL is `socks5://` (or `socks4://`...)
    /// and this.
    pub addr: String,
}

impl Socks {
    /// Start it on a free port and wait until it accepts connections.
    /// Clients of 127.0.0.1 may reach any port of 127.0.0.1 without
    /// authentication; a target that refuses the connection is refused to
    /// the client (SOCKS4 91, SOCKS5 5).
    pub fn start() -> Socks {
        let dir = tempfile::tempdir().unwrap();
        let port = crate::nbd::free_port();
        let conf = dir.path().join("danted.conf");
        // One process per kind (-N 1); no privileged user: it runs as the
        // test's user, and root's warning about that goes to the log.
        std::fs::write(
            &conf,
            format!(
                "logoutput: {log}\n\
                 internal: 127.0.0.1 port = {port}\n\
                 external: 127.0.0.1\n\
                 clientmethod: none\n\
                 socksmethod: none\n\
                 client pass {{ from: 127.0.0.1/32 to: 0.0.0.0/0 }}\n\
                 socks pass {{ from: 127.0.0.1/32 to: 127.0.0.1/32 log: connect }}\n\
                 socks block {{ from: 0.0.0.0/0 to: 0.0.0.0/0 }}\n",
                log = dir.path().join("log").display()
            ),
        )
        .unwrap();
        let mut child =
            Command::new(crate::tools::sbin_binary("danted").expect("danted installed"))
                .arg("-f")
                .arg(&conf)
                .arg("-p")
                .arg(dir.path().join("pid"))
                .args(["-N", "1"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("danted runs");
        crate::tools::wait_listening(&mut child, port, "danted", || {
            std::fs::read_to_string(dir.path().join("log")).unwrap_or_default()
        });
        Socks {
            child,
            dir,
            addr: format!("127.0.0.1:{port}"),
        }
    }
}

impl Socks {
    /// Connections relayed so far (the "tcp/connect" lines of its log).
    pub fn tunnels(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(": tcp/connect ["))
            .count()
    }
}

impl Drop for Socks {
    fn drop(&mut self) {
        // SIGTERM: danted's main process then ends the processes it
        // started; SIGKILL would leave them.
        crate::tools::terminate(&mut self.child);
    }
}
