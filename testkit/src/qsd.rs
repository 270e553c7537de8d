//! qemu-storage-daemon holding an image, driven over QMP: what a live VM's
//! QEMU does to its disk (dirty bitmaps added, cleared, disabled; NBD
//! exports of the disk, writable ones taking writes and read-only ones
//! offering a bitmap) without a VM.
//!
//! The daemon is killed and waited for when dropped ([`Qsd::quit`] stops
//! it cleanly instead: persistent bitmaps are then stored in the image and
//! no longer marked in use).

use serde_json::{Value, json};
use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a QMP command, the daemon's start and an export's removal may
/// take before the test fails.
const TIMEOUT: Duration = Duration::from_secs(60);

/// True if qemu-storage-daemon is installed; else says on standard error
/// that the test is skipped (see [`crate::tools::require`]).
pub fn have_qsd() -> bool {
    crate::tools::require(&["qemu-storage-daemon"])
}

/// An error QEMU answered a command with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QmpError {
    /// The command.
    pub command: String,
    /// QEMU's error class (`GenericError`...).
    pub class: String,
    /// QEMU's message.
    pub desc: String,
}

impl fmt::Display for QmpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QMP {}: {}: {}", self.command, self.class, self.desc)
    }
}

impl std::error::Error for QmpError {}

/// A blocking QMP client: the greeting read and capabilities negotiated on
/// connect; one command at a time; asynchronous events skipped (kept in
/// [`Qmp::events`]).
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    /// The events received so far, oldest first.
    pub events: Vec<Value>,
    /// The greeting's QEMU version (major, minor, micro).
    pub version: (u64, u64, u64),
}

impl Qmp {
    /// Connect to the QMP socket `path`, read the greeting and leave
    /// capabilities negotiation mode (`qmp_capabilities`).
    pub fn connect(path: &Path) -> io::Result<Qmp> {
        let stream = UnixStream::connect(path)?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            next_id: 0,
            events: Vec::new(),
            version: (0, 0, 0),
        };
        let greeting = qmp.read()?;
        let v = &greeting["QMP"]["version"]["qemu"];
        if v.is_null() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not a QMP greeting: {greeting}"),
            ));
        }
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        qmp.version = (n("major"), n("minor"), n("micro"));
        qmp.execute("qmp_capabilities", json!({}))
            .map_err(io::Error::other)?;
        Ok(qmp)
    }

    /// One JSON message from the server.
    fn read(&mut self) -> io::Result<Value> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "QMP connection closed",
            ));
        }
        serde_json::from_str(&line).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("QMP sent {line:?}: {e}"),
            )
        })
    }

    /// Run `cmd` with `args` (an object; `{}` or null for none) and return
    /// its `return` value, or QEMU's error. I/O trouble (the daemon gone)
    /// is an error of class `io`.
    pub fn execute(&mut self, cmd: &str, args: Value) -> Result<Value, QmpError> {
        let io_error = |e: io::Error| QmpError {
            command: cmd.to_string(),
            class: "io".to_string(),
            desc: e.to_string(),
        };
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "execute": cmd, "id": id });
        if !args.is_null() && args.as_object().is_none_or(|o| !o.is_empty()) {
            msg["arguments"] = args;
        }
        let mut line = msg.to_string();
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .and_then(|()| self.writer.flush())
            .map_err(io_error)?;
        loop {
            let reply = self.read().map_err(io_error)?;
            if reply.get("event").is_some() {
                self.events.push(reply);
                continue;
            }
            if reply.get("id").and_then(Value::as_u64) != Some(id) {
                // An answer to nothing we asked (cannot happen: one
                // command at a time); skipped like an event.
                continue;
            }
            if let Some(r) = reply.get("return") {
                return Ok(r.clone());
            }
            let e = &reply["error"];
            return Err(QmpError {
                command: cmd.to_string(),
                class: e["class"].as_str().unwrap_or("?").to_string(),
                desc: e["desc"].as_str().unwrap_or("?").to_string(),
            });
        }
    }
}

/// A qemu-storage-daemon holding one image as the block node [`Qsd::NODE`]
/// (its protocol node is `file0`), with a QMP monitor on a unix socket.
pub struct Qsd {
    child: Child,
    qmp: Qmp,
    dir: PathBuf,
    nbd_socket: Option<PathBuf>,
}

impl Qsd {
    /// The node name of the image (its format layer).
    pub const NODE: &'static str = "disk0";

    /// Start qemu-storage-daemon on the image `img` of format `fmt`
    /// (qcow2, raw), its QMP socket and its log (`qsd.log`: its standard
    /// error) in `dir`. Panics, with the log, if it does not start.
    pub fn start(img: &Path, fmt: &str, dir: &Path) -> Qsd {
        let qmp_sock = dir.join("qmp.sock");
        let log = dir.join("qsd.log");
        let _ = std::fs::remove_file(&qmp_sock);
        let file = format!(
            "driver=file,filename={},node-name=file0",
            escape(img.to_str().unwrap())
        );
        let format = format!("driver={fmt},file=file0,node-name={}", Self::NODE);
        let chardev = format!(
            "socket,path={},server=on,wait=off,id=qmp0",
            escape(qmp_sock.to_str().unwrap())
        );
        let mut child = Command::new("qemu-storage-daemon")
            .args(["--blockdev", &file, "--blockdev", &format])
            .args(["--chardev", &chardev, "--monitor", "chardev=qmp0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("qemu-storage-daemon runs: {e}"));
        let started = Instant::now();
        let qmp = loop {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "qemu-storage-daemon exited at start ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            // The socket file appears before the daemon answers: retry.
            match Qmp::connect(&qmp_sock) {
                Ok(q) => break q,
                Err(e) if started.elapsed() > TIMEOUT => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("qemu-storage-daemon's QMP socket: {e}");
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        Qsd {
            child,
            qmp,
            dir: dir.to_path_buf(),
            nbd_socket: None,
        }
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The QMP client, for commands this type has no function for.
    pub fn qmp(&mut self) -> &mut Qmp {
        &mut self.qmp
    }

    /// Run a QMP command; QEMU's error is returned.
    pub fn try_execute(&mut self, cmd: &str, args: Value) -> Result<Value, QmpError> {
        self.qmp.execute(cmd, args)
    }

    /// Run a QMP command that must succeed (panics with QEMU's error and
    /// the daemon's log).
    pub fn execute(&mut self, cmd: &str, args: Value) -> Value {
        match self.qmp.execute(cmd, args) {
            Ok(v) => v,
            Err(e) => panic!("{e}\nqemu-storage-daemon's log: {}", self.log()),
        }
    }

    /// What the daemon wrote on its standard error so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("qsd.log")).unwrap_or_default()
    }

    /// `block-dirty-bitmap-add` on the image's node: `granularity` in
    /// bytes (QEMU's default, the cluster size, if None), `persistent`:
    /// stored in the qcow2 image.
    pub fn bitmap_add(&mut self, name: &str, granularity: Option<u64>, persistent: bool) {
        let mut args = json!({ "node": Self::NODE, "name": name, "persistent": persistent });
        if let Some(g) = granularity {
            args["granularity"] = json!(g);
        }
        self.execute("block-dirty-bitmap-add", args);
    }

    /// `block-dirty-bitmap-clear`: the bitmap starts again from now.
    pub fn bitmap_clear(&mut self, name: &str) {
        self.bitmap_cmd("block-dirty-bitmap-clear", name);
    }

    /// `block-dirty-bitmap-disable`: the bitmap stops recording writes.
    pub fn bitmap_disable(&mut self, name: &str) {
        self.bitmap_cmd("block-dirty-bitmap-disable", name);
    }

    /// `block-dirty-bitmap-enable`: the bitmap records writes again.
    pub fn bitmap_enable(&mut self, name: &str) {
        self.bitmap_cmd("block-dirty-bitmap-enable", name);
    }

    /// `block-dirty-bitmap-remove`.
    pub fn bitmap_remove(&mut self, name: &str) {
        self.bitmap_cmd("block-dirty-bitmap-remove", name);
    }

    fn bitmap_cmd(&mut self, cmd: &str, name: &str) {
        self.execute(cmd, json!({ "node": Self::NODE, "name": name }));
    }

    /// A frozen copy of the bitmap `from`: a new, disabled, non-persistent
    /// bitmap `to` with `from`'s bits, and, if `clear`, `from` cleared, in
    /// one transaction (no write falls between the copy and the clear).
    /// The way a backup application gets a bitmap a read-only export may
    /// offer: QEMU refuses to export an enabled bitmap of a writable node
    /// read-only ("Enabled bitmap ... incompatible with readonly export").
    /// `from` must not be exported (an exported bitmap is busy).
    pub fn bitmap_freeze(&mut self, from: &str, to: &str, clear: bool) {
        let node = Self::NODE;
        let mut actions = vec![
            json!({ "type": "block-dirty-bitmap-add",
                    "data": { "node": node, "name": to, "disabled": true,
                              "persistent": false } }),
            json!({ "type": "block-dirty-bitmap-merge",
                    "data": { "node": node, "target": to, "bitmaps": [from] } }),
        ];
        if clear {
            actions.push(json!({ "type": "block-dirty-bitmap-clear",
                                 "data": { "node": node, "name": from } }));
        }
        self.execute("transaction", json!({ "actions": actions }));
    }

    /// The image node's bitmaps as QEMU reports them
    /// (`query-named-block-nodes`' `dirty-bitmaps`: name, granularity,
    /// count of dirty bytes, recording, persistent, busy, inconsistent).
    pub fn bitmaps(&mut self) -> Vec<Value> {
        let nodes = self.execute("query-named-block-nodes", json!({ "flat": true }));
        nodes
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["node-name"] == Self::NODE)
            .and_then(|n| n["dirty-bitmaps"].as_array().cloned())
            .unwrap_or_default()
    }

    /// `nbd-server-start` on the unix socket `socket`.
    pub fn nbd_start(&mut self, socket: &Path) {
        let addr = json!({ "type": "unix", "data": { "path": socket.to_str().unwrap() } });
        self.execute("nbd-server-start", json!({ "addr": addr }));
        self.nbd_socket = Some(socket.to_path_buf());
    }

    /// The URL of the export `name` of the NBD server ([`Qsd::nbd_start`]).
    pub fn url(&self, name: &str) -> String {
        let sock = self.nbd_socket.as_ref().expect("nbd_start first");
        format!("nbd+unix:///{name}?socket={}", sock.display())
    }

    /// `block-export-add` of the image's node as the NBD export `name`
    /// (its id too), `writable` or not, offering the dirty bitmaps
    /// `bitmaps` (`qemu:dirty-bitmap:NAME`); its URL. QEMU's error (an
    /// enabled bitmap on a read-only export of a writable node) is
    /// returned.
    pub fn try_export(
        &mut self,
        name: &str,
        writable: bool,
        bitmaps: &[&str],
    ) -> Result<String, QmpError> {
        let mut args = json!({
            "type": "nbd", "id": name, "node-name": Self::NODE, "name": name,
            "writable": writable,
        });
        if !bitmaps.is_empty() {
            args["bitmaps"] = json!(bitmaps);
        }
        self.qmp.execute("block-export-add", args)?;
        Ok(self.url(name))
    }

    /// [`Qsd::try_export`], which must succeed.
    pub fn export(&mut self, name: &str, writable: bool, bitmaps: &[&str]) -> String {
        self.try_export(name, writable, bitmaps)
            .unwrap_or_else(|e| panic!("{e}\nqemu-storage-daemon's log: {}", self.log()))
    }

    /// `block-export-del` of the export `id` (no client may be connected),
    /// and wait until it is gone: its bitmaps are then free to change
    /// (QEMU refuses to clear a bitmap an export offers).
    pub fn export_del(&mut self, id: &str) {
        let started = Instant::now();
        // A client that just quit may not be gone yet on QEMU's side
        // ("export ... still in use"): retried.
        while let Err(e) = self.qmp.execute("block-export-del", json!({ "id": id })) {
            if !e.desc.contains("in use") || started.elapsed() > TIMEOUT {
                panic!("{e}\nqemu-storage-daemon's log: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        loop {
            let exports = self.execute("query-block-exports", json!({}));
            let present = exports
                .as_array()
                .is_some_and(|a| a.iter().any(|e| e["id"] == id));
            if !present {
                return;
            }
            assert!(
                started.elapsed() < TIMEOUT,
                "export {id} still there: {exports}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stop the daemon cleanly (QMP `quit`) and wait for it: persistent
    /// bitmaps are written to the image, which is closed.
    pub fn quit(mut self) {
        // The daemon may close the connection before answering.
        let _ = self.qmp.execute("quit", json!({}));
        let started = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                started.elapsed() < TIMEOUT,
                "qemu-storage-daemon did not quit"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Qsd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(self.dir.join("qmp.sock"));
        if let Some(s) = &self.nbd_socket {
            let _ = std::fs::remove_file(s);
        }
    }
}

/// A value for QEMU's `key=value,...` option syntax: commas doubled.
fn escape(s: &str) -> String {
    s.replace(',', ",,")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{create, qemu_img, scratch};

    fn ready() -> bool {
        crate::tools::have_qemu() && have_qsd()
    }

    /// Bitmaps added, cleared, disabled over QMP; the writable export takes
    /// writes and the bitmap records them; an enabled bitmap cannot be
    /// offered read-only, a frozen copy can; a clean quit stores the
    /// persistent bitmap in the image.
    #[test]
    fn bitmaps_exports_and_quit() {
        if !ready() {
            return;
        }
        let dir = scratch();
        let d = dir.path();
        let img = d.join("disk.qcow2");
        create(&img, "qcow2", &[], "8M");
        let mut qsd = Qsd::start(&img, "qcow2", d);
        assert!(qsd.qmp().version.0 >= 5, "{:?}", qsd.qmp().version);
        qsd.bitmap_add("b", Some(65536), true);
        qsd.bitmap_add("t", None, false);
        let sock = d.join("nbd.sock");
        qsd.nbd_start(&sock);
        let w = qsd.export("w", true, &[]);
        assert_eq!(w, format!("nbd+unix:///w?socket={}", sock.display()));

        crate::tools::run_ok(
            "qemu-io",
            &["-f", "raw", "-c", "write -P 7 1M 4k", &w],
            None,
        );
        let count = |qsd: &mut Qsd, name: &str| {
            let b = qsd.bitmaps();
            let b = b.iter().find(|b| b["name"] == name).unwrap();
            b["count"].as_u64().unwrap()
        };
        assert_eq!(count(&mut qsd, "b"), 65536);

        // QEMU refuses an enabled bitmap on a read-only export of a
        // writable node; a writable export may offer it, and a frozen copy
        // can be offered read-only.
        let e = qsd.try_export("r", false, &["b"]).unwrap_err();
        assert!(e.desc.contains("incompatible with readonly"), "{e}");
        qsd.export("rw", true, &["b"]);
        // An exported bitmap is busy: it cannot be cleared (nor copied).
        let e = qsd
            .try_execute(
                "block-dirty-bitmap-clear",
                json!({"node": Qsd::NODE, "name": "b"}),
            )
            .unwrap_err();
        assert!(e.desc.contains("in use"), "{e}");
        qsd.export_del("rw");
        qsd.bitmap_freeze("b", "snap", false);
        let r = qsd.export("r", false, &["snap"]);
        assert!(r.ends_with(&format!("/r?socket={}", sock.display())));
        qsd.bitmap_clear("b");
        assert_eq!(count(&mut qsd, "b"), 0);
        assert_eq!(count(&mut qsd, "snap"), 65536);
        qsd.export_del("r");
        qsd.bitmap_remove("snap");
        qsd.bitmap_disable("t");
        crate::tools::run_ok(
            "qemu-io",
            &["-f", "raw", "-c", "write -P 8 3M 4k", &w],
            None,
        );
        assert_eq!(count(&mut qsd, "b"), 65536);
        assert_eq!(count(&mut qsd, "t"), 65536, "disabled: 1M's write only");
        let e = qsd.try_execute("no-such-command", json!({})).unwrap_err();
        assert_eq!(e.class, "CommandNotFound");
        qsd.quit();

        // Stored in the image: b (persistent), not t.
        let out = qemu_img(&["info", "--output=json", img.to_str().unwrap()]);
        let info: Value = serde_json::from_slice(&out.stdout).unwrap();
        let bitmaps = &info["format-specific"]["data"]["bitmaps"];
        let names: Vec<&str> = bitmaps
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["b"]);
        assert_eq!(bitmaps[0]["flags"], json!(["auto"]));
        assert_eq!(bitmaps[0]["granularity"], 65536);
    }

    /// Dropped without quitting: the daemon is killed, its sockets
    /// removed, and the persistent bitmap it loaded is left marked in use.
    #[test]
    fn drop_kills() {
        if !ready() {
            return;
        }
        let dir = scratch();
        let d = dir.path();
        let img = d.join("disk.qcow2");
        create(&img, "qcow2", &[], "1M");
        // A persistent bitmap is written to the image when it is closed,
        // and marked in use when an image holding it is opened to write.
        let mut qsd = Qsd::start(&img, "qcow2", d);
        qsd.bitmap_add("b", None, true);
        qsd.quit();
        let mut qsd = Qsd::start(&img, "qcow2", d);
        qsd.nbd_start(&d.join("nbd.sock"));
        let pid = qsd.pid();
        drop(qsd);
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        assert!(!d.join("qmp.sock").exists() && !d.join("nbd.sock").exists());
        let out = qemu_img(&["info", "--output=json", img.to_str().unwrap()]);
        let info: Value = serde_json::from_slice(&out.stdout).unwrap();
        let flags = &info["format-specific"]["data"]["bitmaps"][0]["flags"];
        assert!(
            flags.as_array().unwrap().contains(&json!("in-use")),
            "{info}"
        );
    }
}
