//! Asking the processor for memory a loop will read soon.
//!
//! The reader's two hot loops walk memory another core or the page cache wrote, in order: the
//! decoder the file's mapped pages, the reports' trackers the decoder's batches. The hardware's
//! own prefetcher stops at each 4 KiB page, so every page began with a miss: the first load of a
//! page's first record took a quarter of the decoder's time and a quarter of the trackers' own
//! (perf annotate, the bench's 1.88 GB loop trace). A hint a page ahead hides it.

/// Asks for the cache line [`DISTANCE`] bytes past `items[at]`, if `items` reaches that far;
/// nothing is read, and no fault can come of it (a hint to a page not mapped is dropped).
#[inline(always)]
pub fn ahead<T>(items: &[T], at: usize) {
    let further = at.saturating_add(DISTANCE / std::mem::size_of::<T>().max(1));
    #[cfg(target_arch = "x86_64")]
    if let Some(item) = items.get(further) {
        use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let p = (item as *const T).cast::<i8>();
        // SAFETY: a prefetch reads nothing the program sees and never faults; `p` points into
        // `items`, which the borrow keeps alive.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (items, further);
}

/// How far ahead the hot loops ask, in bytes: a page, so that the next page's walk and its
/// first line are on their way while this one is read.
pub const DISTANCE: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asking_ahead_never_reaches_past_the_slice() {
        // Near the end, past it, at the largest index, of a type with no size: no panic, and
        // nothing read (a hint has no effect the program can see).
        let bytes = vec![7u8; DISTANCE + 3];
        for at in [0, 2, 3, 4, DISTANCE, usize::MAX - 1, usize::MAX] {
            ahead(&bytes, at);
        }
        ahead(&[(); 4], 1);
        ahead::<u64>(&[], 0);
        assert_eq!(
            bytes.iter().map(|&b| u64::from(b)).sum::<u64>(),
            7 * (DISTANCE as u64 + 3)
        );
    }
}
