//! libvirt's daemon and domains for the tests: what runs a VM's disk in
//! production (checkpoints, pull-mode backups exporting the disk over
//! NBD, virtnbdbackup) on this host, leaving nothing behind.
//!
//! [`Libvirtd`] runs libvirtd in a private mount namespace (`unshare -m`):
//! a tmpfs on /run, and the test's own directories on /run/libvirt (its
//! socket directory: `virsh` with no `-c` finds it there, inside),
//! /var/lib/libvirt, /var/log/libvirt, /var/cache/libvirt, /var/tmp and
//! /etc/libvirt/qemu (the domains' definitions), and its own qemu.conf on
//! /etc/libvirt/qemu.conf (QEMU runs as root: /dev/kvm is root's, and
//! without it every `virsh define` probes QEMU again for some 40 s;
//! stdio_handler "file": no virtlogd). So no file of the host is changed
//! or left, and everything it made goes with the test's directory. Its
//! socket is in that directory; [`Libvirtd::uri`] names it for virsh and
//! virtnbdbackup (`-U`) outside; [`Libvirtd::inside`] runs a program in
//! the namespace, where the defaults reach it (a guide's commands as
//! written: `virsh`, `virtnbdbackup` with no URI). It runs in the foreground, a child of the test,
//! stopped by its pid with SIGTERM when dropped (its QEMU processes with
//! it: [`Domain`]s destroy theirs first). Root only (the test command
//! runs as root on CI): else the tests using it say they are skipped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long libvirtd may take to answer after its start.
const START: Duration = Duration::from_secs(60);

/// True if libvirtd, virsh, unshare and virtnbdbackup are installed and
/// this is root; else says that the test is skipped and why.
pub fn have_libvirt() -> bool {
    if !crate::tools::require(&[
        "libvirtd",
        "virsh",
        "unshare",
        "qemu-system-x86_64",
        "virtnbdbackup",
        "virtnbdrestore",
    ]) {
        return false;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("libvirt tests need root (a private mount namespace): test skipped");
        return false;
    }
    true
}

/// A libvirtd of the test's own (see the module doc).
pub struct Libvirtd {
    child: Child,
    dir: PathBuf,
    uri: String,
}

impl Libvirtd {
    /// Start libvirtd with its state, logs and socket in `dir` (a short
    /// path: unix sockets take 107 bytes). Panics, with its log, if it
    /// does not answer.
    pub fn start(dir: &Path) -> Libvirtd {
        for d in ["lib", "log", "cache", "sock", "vartmp", "etc"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::write(
            dir.join("qemu.conf"),
            "user = \"root\"\ngroup = \"root\"\nstdio_handler = \"file\"\n",
        )
        .unwrap();
        let sock = dir.join("sock");
        std::fs::write(
            dir.join("libvirtd.conf"),
            format!("unix_sock_dir = \"{}\"\n", sock.display()),
        )
        .unwrap();
        let d = dir.display();
        let script = format!(
            "set -e; mount -t tmpfs tmpfs /run; mkdir -p /run/libvirt; \
             mount --bind '{d}/sock' /run/libvirt; \
             mount --bind '{d}/vartmp' /var/tmp; \
             mount --bind '{d}/lib' /var/lib/libvirt; \
             mount --bind '{d}/log' /var/log/libvirt; \
             mount --bind '{d}/cache' /var/cache/libvirt; \
             mount --bind '{d}/qemu.conf' /etc/libvirt/qemu.conf; \
             mount --bind '{d}/etc' /etc/libvirt/qemu; \
             exec libvirtd -f '{d}/libvirtd.conf' -p '{d}/libvirtd.pid'"
        );
        let log = std::fs::File::create(dir.join("libvirtd.log")).unwrap();
        let child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("unshare runs: {e}"));
        let mut lv = Libvirtd {
            child,
            dir: dir.to_path_buf(),
            uri: format!("qemu:///system?socket={}/libvirt-sock", sock.display()),
        };
        let started = Instant::now();
        loop {
            if let Some(status) = lv.child.try_wait().unwrap() {
                panic!("libvirtd exited at start ({status}): {}", lv.log());
            }
            if sock.join("libvirt-sock").exists() && lv.try_virsh(&["version"]).status.success() {
                break;
            }
            if started.elapsed() > START {
                panic!("libvirtd does not answer: {}", lv.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        lv
    }

    /// The URI that reaches it (virsh `-c`, virtnbdbackup `-U`).
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `prog` to run in its mount namespace (`nsenter`), where /run/libvirt
    /// holds its socket: a client with no URI reaches it. The directory
    /// given when it started is seen there as it is outside.
    pub fn inside(&self, prog: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args(["-t", &self.child.id().to_string(), "-m", "--", prog]);
        cmd
    }

    /// What libvirtd wrote so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("libvirtd.log")).unwrap_or_default()
    }

    /// `virsh -c URI ARGS...`, whatever it answers.
    pub fn try_virsh(&self, args: &[&str]) -> Output {
        Command::new("virsh")
            .args(["-c", &self.uri])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("virsh runs: {e}"))
    }

    /// `virsh -c URI ARGS...`, which must succeed: its standard output.
    pub fn virsh(&self, args: &[&str]) -> String {
        let out = self.try_virsh(args);
        assert!(
            out.status.success(),
            "virsh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        // SAFETY: kill on our own child's pid, not yet waited for.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running domain with one qcow2 disk, no OS, under TCG: `sda` on
/// virtio-scsi ([`Domain::start`]) or `vda` on virtio-blk
/// ([`Domain::start_virtio`], what most VMs have). Destroyed and
/// undefined, with its checkpoints' metadata, when dropped.
pub struct Domain<'a> {
    lv: &'a Libvirtd,
    name: String,
    /// The disk's target (`sda`, `vda`): its name in backups and bitmaps.
    target: &'static str,
    /// The device whose block backend [`Domain::write`] writes through.
    qdev: &'static str,
}

impl<'a> Domain<'a> {
    /// Define and start domain `name` on the qcow2 image `disk` (a path as
    /// libvirtd sees it), its disk `sda` on virtio-scsi.
    pub fn start(lv: &'a Libvirtd, name: &str, disk: &Path) -> Domain<'a> {
        let controller = "<controller type='scsi' model='virtio-scsi'/>";
        Self::define(lv, name, disk, controller, ("sda", "scsi"), "scsi0-0-0-0")
    }

    /// Define and start domain `name` on the qcow2 image `disk`, its disk
    /// `vda` on virtio-blk.
    pub fn start_virtio(lv: &'a Libvirtd, name: &str, disk: &Path) -> Domain<'a> {
        // virtio-blk's block backend is its child's, not the device's.
        let qdev = "/machine/peripheral/virtio-disk0/virtio-backend";
        Self::define(lv, name, disk, "", ("vda", "virtio"), qdev)
    }

    fn define(
        lv: &'a Libvirtd,
        name: &str,
        disk: &Path,
        controller: &str,
        (target, bus): (&'static str, &str),
        qdev: &'static str,
    ) -> Domain<'a> {
        // <acpi/>: without it libvirt 9 passes -no-acpi, which QEMU 10
        // no longer takes.
        let xml = format!(
            "<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <features><acpi/></features>
  <os><type arch='x86_64'>hvm</type></os>
  <devices>
    {controller}
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{}'/>
      <target dev='{target}' bus='{bus}'/>
    </disk>
    <memballoon model='none'/>
  </devices>
</domain>
",
            disk.display()
        );
        let file = lv.dir.join(format!("{name}.xml"));
        std::fs::write(&file, xml).unwrap();
        lv.virsh(&["define", file.to_str().unwrap()]);
        let dom = Domain {
            lv,
            name: name.to_string(),
            target,
            qdev,
        };
        lv.virsh(&["start", name]);
        dom
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its disk's target: `sda` or `vda`.
    pub fn target(&self) -> &str {
        self.target
    }

    /// Run the qemu-io command `cmd` (`write -P 0x5 1M 64k`) on the disk
    /// as the guest's writes: through the device. virsh exits 0 even when
    /// the command fails, so any text it prints is the error.
    pub fn write(&self, cmd: &str) {
        let hmp = format!("qemu-io -d {} \"{cmd}\"", self.qdev);
        let out = self
            .lv
            .virsh(&["qemu-monitor-command", &self.name, "--hmp", &hmp]);
        assert!(out.trim().is_empty(), "qemu-io {cmd}: {out}");
    }

    /// Start a pull-mode backup exporting the disk (`sda`, `vda`: its
    /// [`Domain::target`]) on the unix socket `sock` (NBD export named as
    /// the disk): incremental from checkpoint `from` if given (the export
    /// then offers `qemu:dirty-bitmap:backup-TARGET`), and creating checkpoint
    /// `checkpoint` if given.
    pub fn backup_begin(&self, sock: &Path, from: Option<&str>, checkpoint: Option<&str>) {
        let inc = from.map_or(String::new(), |c| format!("<incremental>{c}</incremental>"));
        let backup = format!(
            "<domainbackup mode='pull'>{inc}<server transport='unix' socket='{}'/>\
             <disks><disk name='{}' backup='yes' type='file'>\
             <scratch file='{}'/></disk></disks></domainbackup>",
            sock.display(),
            self.target,
            sock.with_extension("scratch").display()
        );
        let bfile = self.lv.dir.join("backup.xml");
        std::fs::write(&bfile, backup).unwrap();
        let mut args = vec!["backup-begin", &self.name, bfile.to_str().unwrap()];
        let cfile = self.lv.dir.join("checkpoint.xml");
        if let Some(c) = checkpoint {
            std::fs::write(
                &cfile,
                format!(
                    "<domaincheckpoint><name>{c}</name><disks><disk name='{}' \
                     checkpoint='bitmap'/></disks></domaincheckpoint>",
                    self.target
                ),
            )
            .unwrap();
            args.push(cfile.to_str().unwrap());
        }
        self.lv.virsh(&args);
        let t = Instant::now();
        while !sock.exists() && t.elapsed() < START {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// End the pull-mode backup (its scratch file goes with it).
    pub fn backup_end(&self) {
        self.lv.virsh(&["domjobabort", &self.name]);
    }
}

impl Drop for Domain<'_> {
    fn drop(&mut self) {
        let _ = self.lv.try_virsh(&["destroy", &self.name]);
        let _ = self
            .lv
            .try_virsh(&["undefine", &self.name, "--checkpoints-metadata"]);
    }
}
