//! Tuning of the C allocator for payload-sized buffers: the one place with `unsafe` code.
//!
//! glibc's malloc serves a request of 128 KiB or more with its own `mmap`, returned to the
//! system when freed, but raises that threshold to the size of every such block freed (up to
//! 32 MiB). After the first large payload was freed, payload buffers came from the threads'
//! heaps instead, and those keep freed memory: `svc run` with messages of 1 MiB and 8 MiB
//! peaked at 169-271 MiB of RSS for a 64 MiB `delivery.max_in_flight_bytes`. A fixed
//! threshold keeps every payload-sized buffer in its own mapping, so what the byte bound
//! frees goes back to the system: 119-136 MiB for the same runs, faster too
//! (`cargo bench --bench memory_bound`, docs/architecture.md, "Memory bound").

/// Buffers of at least this size are mapped on their own and unmapped when freed.
const MMAP_THRESHOLD: i32 = 256 * 1024;

/// Fixes glibc's mmap threshold (see the module comment). Call once, before the threads start.
/// Elsewhere (musl, other systems) nothing is done.
pub fn keep_large_buffers_returnable() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        /// `M_MMAP_THRESHOLD` of glibc's malloc.h.
        const M_MMAP_THRESHOLD: i32 = -3;
        #[allow(unsafe_code)]
        extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        // SAFETY: mallopt takes two integers and changes only the allocator's settings; glibc
        // documents M_MMAP_THRESHOLD as settable at any time. Returns 0 on failure, which
        // leaves the default (more memory, nothing unsound).
        #[allow(unsafe_code)]
        let ok = unsafe { mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) } == 1;
        if !ok {
            log::debug!("allocator: mallopt(M_MMAP_THRESHOLD) refused; default kept");
        }
    }
}
