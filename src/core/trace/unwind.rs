//! Call stacks as raw instruction pointers, captured without allocating; symbolized offline.

/// The most frames kept per stack: Python frames and native ones together.
pub const MAX_FRAMES: usize = 64;
/// The most native frames captured per stack.
pub const NATIVE_FRAMES: usize = 32;
/// The most Python frames captured per stack.
pub const PYTHON_FRAMES: usize = 32;

/// Captures the calling thread's return addresses into `out`, skipping the innermost `skip`
/// frames (the recorder's own). Returns how many were written. Allocates nothing and takes no
/// lock of ours; the unwinder may take the dynamic loader's (recursive) lock to find unwind
/// tables, so this must not run inside `dlsym` or a constructor.
pub fn capture(skip: usize, out: &mut [u64]) -> usize {
    walk(skip, out, None)
}

/// Like [`capture`], and also writes each frame's canonical frame address (the caller's stack
/// pointer before the call; on x86_64 the frame's return address lies just below it) into
/// `cfas`, which must be as long as `out`.
pub fn capture_with_cfas(skip: usize, out: &mut [u64], cfas: &mut [u64]) -> usize {
    walk(skip, out, Some(cfas))
}

fn walk(skip: usize, out: &mut [u64], mut cfas: Option<&mut [u64]>) -> usize {
    let room = match &cfas {
        Some(c) => out.len().min(c.len()),
        None => out.len(),
    };
    let mut n = 0;
    let mut seen = 0;
    // SAFETY: trace_unsynchronized is unsafe only because it does not serialize concurrent
    // unwinds; the unwinder it uses (libgcc's) is thread-safe, and we only read addresses.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            let ip = frame.ip() as u64;
            if ip == 0 {
                return false; // the outermost frame of a thread
            }
            seen += 1;
            if seen <= skip {
                return true;
            }
            if n < room {
                out[n] = ip;
                if let Some(c) = cfas.as_deref_mut() {
                    c[n] = frame.sp() as u64;
                }
                n += 1;
            }
            n < room
        });
    }
    n
}

/// A hash of a stack, never 0.
pub fn hash(frames: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &f in frames {
        h ^= f;
        h = h.wrapping_mul(0x0000_0100_0000_01b3).rotate_left(5);
    }
    h | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn inner(out: &mut [u64]) -> usize {
        capture(0, out)
    }

    #[test]
    fn a_capture_returns_distinct_nonzero_return_addresses() {
        let mut stacks = Vec::new();
        // A count the compiler cannot see: a loop of two unrolled in a release build calls
        // `inner` from two places, whose stacks differ in that frame.
        for _ in 0..std::hint::black_box(2) {
            let mut a = [0u64; MAX_FRAMES];
            let n = inner(&mut a);
            assert!(n >= 3, "only {n} frames");
            assert!(a[..n].iter().all(|&ip| ip != 0));
            stacks.push(a[..n].to_vec());
        }
        // Two captures from the same place give the same stack, so it deduplicates.
        assert_eq!(stacks[0], stacks[1]);
        assert_eq!(hash(&stacks[0]), hash(&stacks[1]));
    }
}
