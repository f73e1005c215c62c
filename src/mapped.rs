//! Files read through memory maps: an Arrow buffer over a whole file, its pages read in
//! at once, that no copy into fresh memory ever pays for (a fresh page costs more than
//! the copy into it).

use std::fs::File;
use std::sync::Arc;

use arrow_buffer::Buffer;

/// A file mapped read-only, unmapped when the last buffer over it goes.
struct Mapping {
    address: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only memory owned by this value alone; reading it from any
// thread is sound, and only `drop` unmaps it.
unsafe impl Send for Mapping {}
// SAFETY: as above: nothing writes through the pointer.
unsafe impl Sync for Mapping {}
impl std::panic::RefUnwindSafe for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map_file` made, once; no buffer points into
        // it any more (they hold this value alive).
        unsafe { libc::munmap(self.address.as_ptr().cast(), self.len) };
    }
}

/// A file's identity: a file rewritten and renamed into place is another one.
type FileKey = (u64, u64, u64, i64, i64);

/// The mappings of [`map_shared`] files that some buffer still holds.
static SHARED: std::sync::Mutex<
    Option<std::collections::HashMap<FileKey, std::sync::Weak<Mapping>>>,
> = std::sync::Mutex::new(None);

/// [`map_file`], but a file mapped already (and still held by some buffer) is not mapped
/// again: its buffer shares that mapping. For files read again and again while earlier
/// reads are still held: a full shuffle's batches point into the decoded copies' mapped
/// units (see `crate::pipeline::interleave_viewing`), a batch into a unit per row, and a
/// mapping per visit would have held one per batch and unit, up to the system's
/// limit on mappings (65,530 by default) for a caller that keeps its batches.
pub fn map_shared(file: &File, populate: bool) -> std::io::Result<Option<Buffer>> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    let key = (
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
    );
    let held = |shared: &mut std::collections::HashMap<FileKey, std::sync::Weak<Mapping>>| {
        shared.get(&key).and_then(std::sync::Weak::upgrade)
    };
    let lock = || SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(mapping) = held(lock().get_or_insert_with(Default::default)) {
        let (address, len) = (mapping.address, mapping.len);
        // SAFETY: the mapping's `len` readable bytes, which nothing writes, kept alive by
        // the buffer's owner.
        return Ok(Some(unsafe {
            Buffer::from_custom_allocation(address, len, mapping)
        }));
    }
    // Mapped (and read in, where `populate`) without the lock: two threads may map one
    // file at once, and the later entry stands.
    let Some((buffer, mapping)) = map(file, meta.len(), populate)? else {
        return Ok(None);
    };
    let mut shared = lock();
    let shared = shared.get_or_insert_with(Default::default);
    // Entries of mappings gone are dropped now and then, not at every unmap.
    if shared.len() >= 1024 && shared.len().is_power_of_two() {
        shared.retain(|_, mapping| mapping.strong_count() > 0);
    }
    shared.insert(key, Arc::downgrade(&mapping));
    Ok(Some(buffer))
}

/// `file`'s bytes (`None` for an empty file) as one buffer over a private read-only
/// mapping: populated at once where the whole file will be read (`populate`), else its
/// pages mapped as they are touched (a few rows of a larger file: populating 16 MB to
/// read 256 KB of it cost a full shuffle most of its time). The file must not be
/// truncated or written in place while mapped: callers map files only they write, and
/// only whole (renamed into place, or nameless).
pub fn map_file(file: &File, populate: bool) -> std::io::Result<Option<Buffer>> {
    Ok(map(file, file.metadata()?.len(), populate)?.map(|(buffer, _)| buffer))
}

/// `file`'s `len` bytes mapped: the buffer over them, and the mapping it holds.
fn map(file: &File, len: u64, populate: bool) -> std::io::Result<Option<(Buffer, Arc<Mapping>)>> {
    use std::os::fd::AsRawFd;
    let len = usize::try_from(len).map_err(std::io::Error::other)?;
    if len == 0 {
        return Ok(None);
    }
    // SAFETY: a fresh private read-only mapping of an open file descriptor; the result is
    // checked before use.
    let address = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            if populate {
                libc::MAP_PRIVATE | libc::MAP_POPULATE
            } else {
                libc::MAP_PRIVATE
            },
            file.as_raw_fd(),
            0,
        )
    };
    if address == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let address = std::ptr::NonNull::new(address.cast::<u8>())
        .ok_or_else(|| std::io::Error::other("mmap gave a null address"))?;
    let mapping = Arc::new(Mapping { address, len });
    // SAFETY: the mapping is `len` readable bytes that nothing writes, kept alive by the
    // buffer's owner.
    let buffer = unsafe { Buffer::from_custom_allocation(address, len, mapping.clone()) };
    Ok(Some((buffer, mapping)))
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::Write;

    #[test]
    fn a_file_held_mapped_is_not_mapped_again_and_a_rewritten_one_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("unit.arrow");
        std::fs::write(&path, [7u8; 5000]).unwrap();
        let first = super::map_shared(&File::open(&path).unwrap(), false)
            .unwrap()
            .unwrap();
        let again = super::map_shared(&File::open(&path).unwrap(), true)
            .unwrap()
            .unwrap();
        assert_eq!(first.as_ptr(), again.as_ptr());
        assert_eq!(again.as_slice(), &[7u8; 5000][..]);
        // Rewritten through a new file renamed into place, as the decoded cache writes.
        let fresh = dir.path().join("unit.tmp");
        File::create(&fresh)
            .unwrap()
            .write_all(&[9u8; 5000])
            .unwrap();
        std::fs::rename(&fresh, &path).unwrap();
        let rewritten = super::map_shared(&File::open(&path).unwrap(), false)
            .unwrap()
            .unwrap();
        assert_ne!(rewritten.as_ptr(), first.as_ptr());
        assert_eq!(rewritten.as_slice(), &[9u8; 5000][..]);
        assert_eq!(first.as_slice(), &[7u8; 5000][..]);
    }
}
