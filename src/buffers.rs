//! Large output buffers used again. A buffer handed out in a batch comes back to its pool
//! once every holder of the batch (numpy, torch, the consumer, a later join) has let it
//! go, rather than to the allocator: a fresh buffer of megabytes is paid for in page
//! faults, the kernel zeroing each new page, and again in handing the pages back.
//! mimalloc gives blocks over 16 MiB their own mapping, reset when another thread frees
//! them, so they never come back warm.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use arrow_buffer::Buffer;

/// Free buffers, up to a number (`keep`) that the user of the pool sets.
#[derive(Default)]
pub struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
    /// Free buffers kept at most; buffers coming back past it are freed.
    keep: AtomicUsize,
}

/// A pooled buffer's memory while a batch holds it; back to the pool when dropped (or
/// freed, when the pool is gone or full).
struct Pooled {
    memory: Vec<u8>,
    pool: Weak<BufferPool>,
}

impl Drop for Pooled {
    fn drop(&mut self) {
        // Never waits for the lock: a forked child (PyTorch's workers) may drop batches
        // it inherited while the lock was held by a parent's thread it does not have.
        // Such a buffer is simply freed.
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        let free = match pool.free.try_lock() {
            Ok(free) => Some(free),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if let Some(mut free) = free
            && free.len() < pool.keep.load(Ordering::Relaxed)
        {
            free.push(std::mem::take(&mut self.memory));
        }
    }
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("keep", &self.keep.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl BufferPool {
    /// A pool that keeps up to `keep` free buffers.
    pub fn keeping(keep: usize) -> Arc<Self> {
        Arc::new(Self {
            free: Mutex::default(),
            keep: AtomicUsize::new(keep),
        })
    }

    /// Keeps up to `keep` free buffers from now on.
    pub fn set_keep(&self, keep: usize) {
        self.keep.store(keep, Ordering::Relaxed);
    }

    /// An empty buffer that can hold `len` bytes: a free one of about that size, or new.
    pub fn take(&self, len: usize) -> Vec<u8> {
        self.take_with_room(len, 0)
    }

    /// The same, a new one made `room` bytes larger than `len`: batches whose sizes vary
    /// (images each of its own size) then fit in the buffers of batches a little smaller.
    pub fn take_with_room(&self, len: usize, room: usize) -> Vec<u8> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        match free
            .iter()
            .position(|m| m.capacity() >= len && m.capacity() <= len.saturating_mul(2))
        {
            Some(i) => {
                let mut memory = free.swap_remove(i);
                memory.clear();
                memory
            }
            None => Vec::with_capacity(len.saturating_add(room)),
        }
    }

    /// `memory` as an Arrow buffer that comes back to this pool when released.
    pub fn buffer(self: &Arc<Self>, memory: Vec<u8>) -> Buffer {
        let ptr = NonNull::new(memory.as_ptr().cast_mut()).unwrap_or(NonNull::dangling());
        let len = memory.len();
        let owner = Arc::new(Pooled {
            memory,
            pool: Arc::downgrade(self),
        });
        // SAFETY: `ptr` points at `len` initialised bytes of `owner.memory`, whose heap
        // allocation neither moves nor changes while `owner` lives (the buffer keeps it).
        unsafe { Buffer::from_custom_allocation(ptr, len, owner) }
    }
}

#[cfg(test)]
mod tests {
    use super::BufferPool;

    #[test]
    fn a_released_buffer_is_taken_again_up_to_the_kept_number() {
        let pool = BufferPool::keeping(1);
        let free = || pool.free.lock().unwrap().len();
        let (mut a, mut b) = (pool.take(1000), pool.take(1000));
        a.resize(1000, 1);
        b.resize(1000, 2);
        let a_at = a.as_ptr();
        let (a, b) = (pool.buffer(a), pool.buffer(b));
        assert_eq!(a.as_slice(), [1; 1000]);
        drop(a);
        drop(b);
        // One came back (the first released); the other was freed: the pool keeps one.
        assert_eq!(free(), 1);
        let again = pool.take(900);
        assert_eq!(again.as_ptr(), a_at);
        assert!(again.is_empty() && again.capacity() >= 1000);
        assert_eq!(free(), 0);
        // A free buffer over twice the size asked for is not used.
        drop(pool.buffer(again));
        assert_eq!(pool.take(400).capacity(), 400);
        assert_eq!(free(), 1);
        // A pool that keeps none frees what comes back.
        pool.set_keep(0);
        drop(pool.buffer(pool.take(100)));
        assert_eq!(free(), 1);
    }
}
