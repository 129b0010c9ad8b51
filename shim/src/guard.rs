//! The re-entrancy guard: a CUDA call made while another hooked call is in progress on the same
//! thread (the runtime reaching the driver through our wrappers, or the shim's own calls) is
//! forwarded without being recorded, so each application call is counted once.

use core::cell::Cell;

thread_local! {
    // Const-initialized and without a destructor: plain TLS, no lazy registration.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

pub struct Guard {
    outermost: bool,
}

impl Guard {
    pub fn enter() -> Guard {
        let before = DEPTH
            .try_with(|d| {
                let v = d.get();
                d.set(v.saturating_add(1));
                v
            })
            .unwrap_or(1);
        Guard {
            outermost: before == 0,
        }
    }

    /// Whether this call should be recorded: the outermost hooked call, with the shim enabled.
    pub fn records(&self) -> bool {
        self.outermost && crate::state::enabled()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
    }
}
