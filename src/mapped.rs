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

/// `file`'s bytes (`None` for an empty file) as one buffer over a private read-only
/// mapping: populated at once where the whole file will be read (`populate`), else its
/// pages mapped as they are touched (a few rows of a larger file: populating 16 MB to
/// read 256 KB of it cost a full shuffle most of its time). The file must not be
/// truncated or written in place while mapped: callers map files only they write, and
/// only whole (renamed into place, or nameless).
pub fn map_file(file: &File, populate: bool) -> std::io::Result<Option<Buffer>> {
    use std::os::fd::AsRawFd;
    let len = usize::try_from(file.metadata()?.len()).map_err(std::io::Error::other)?;
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
    Ok(Some(unsafe {
        Buffer::from_custom_allocation(address, len, mapping)
    }))
}
