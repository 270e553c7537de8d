//! Hashing one input: open it, hash it as the job asks, show progress.

use blkcli::lines::Tag;
use blkcli::progress::Progress;
use blkjob::checkpoint::Checkpoint;
use blkjob::{Hashed, Job, JobSpec};
use std::ffi::OsStr;
use std::io;
use std::sync::atomic::Ordering;

/// Everything needed to hash inputs, shared by all of them.
pub struct Hashing {
    /// The job the options ask for; the digest and block size are each
    /// input's (a `--check` line may name its own).
    pub job: Job,
    pub progress: Progress,
    /// Resume from and save to a checkpoint (one input).
    pub checkpoint: Option<Checkpoint>,
}

impl Hashing {
    /// The checksum of `name` in construction `c` with `alg` and `block_size`.
    pub fn checksum(&self, name: &OsStr, (c, alg, block_size): Tag) -> io::Result<Hashed> {
        let spec = JobSpec {
            construction: c,
            digest: Some(alg),
            block_size: Some(block_size),
            ..self.job.spec()
        };
        let job = spec.build()?;
        let shown = blkcli::shown_lossy(name);
        // A backup in its datastore in the pbs construction: its chunks
        // checked against the index, whose digests are the block digests.
        let path = std::path::Path::new(name);
        if self.checkpoint.is_none()
            && let Some(image) = blkjob::pbs_checkable(path, &job)?
        {
            let size = image.header().size;
            return self.progress.track(&shown, Some(size), |progress| {
                blkjob::hash_pbs_chunks(image, path, &job, progress)
            });
        }
        let input = match job.open(name) {
            Ok(input) => input,
            // A fixed index without its datastore: what its digests give.
            Err(e) => match blkimage::cause::<blkimage::pbs::NoDatastore>(&e) {
                Some(nd) => return blkjob::index_checksum(&nd.index, &job),
                None => return Err(e),
            },
        };
        let size = input.size();
        self.progress
            .track(&shown, size, |progress| match &self.checkpoint {
                Some(ck) => blkjob::checkpoint::hash(name, input, &job, ck, progress),
                None => blkjob::hash(input, &job, progress),
            })
    }

    /// Whether Ctrl-C or SIGTERM stopped the run.
    pub fn cancelled(&self) -> bool {
        self.job.cancel().load(Ordering::Relaxed)
    }
}
