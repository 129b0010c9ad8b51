//! Process-wide settings, read once: the off switch and the configuration.

use crate::cuda::symbols::Sym;
use crate::os::say;
use core::cell::UnsafeCell;

use core::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use gpushim_core::config::{self, Conf};

static ENABLED: crate::os::LazyFlag = crate::os::LazyFlag::new();

/// `false` when `GPUSHIM_DISABLE` is set to anything but `0` or empty: then every hook only
/// forwards, `dlsym` and the entry-point lookups hand out the real functions, and nothing is
/// written. Safe inside `dlsym` and constructors: no allocation, no lock.
pub fn enabled() -> bool {
    ENABLED.get(|| !crate::options::Switch::Disable.on())
}

struct ConfCell(UnsafeCell<Conf>);
// SAFETY: written once by the thread that moves CONF_STATE from 0 to 1, read only after
// CONF_STATE is 2 (Release/Acquire).
unsafe impl Sync for ConfCell {}

static CONF: ConfCell = ConfCell(UnsafeCell::new(Conf::DEFAULT));
static CONF_STATE: AtomicU8 = AtomicU8::new(0);

/// The configuration from `GPUSHIM_CONF`, parsed on first use. A bad value prints one line
/// naming the key and what it accepts, and the defaults apply.
pub fn conf() -> Conf {
    loop {
        match CONF_STATE.compare_exchange(0, 1, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => {
                let c = read_conf();
                // SAFETY: we won the 0 -> 1 transition; nobody reads CONF before state 2.
                unsafe { *CONF.0.get() = c };
                CONF_STATE.store(2, Ordering::Release);
                return c;
            }
            Err(2) => {
                // SAFETY: state 2 was published with Release after the write.
                return unsafe { *CONF.0.get() };
            }
            Err(_) => core::hint::spin_loop(),
        }
    }
}

fn read_conf() -> Conf {
    let Some(text) = crate::options::Switch::Conf.value() else {
        return Conf::default();
    };
    let Ok(text) = text.to_str() else {
        say(format_args!(
            "GPUSHIM_CONF is not valid UTF-8; using the defaults"
        ));
        return Conf::default();
    };
    let (c, err) = config::parse(text);
    if let Some(e) = err {
        say(format_args!(
            "GPUSHIM_CONF: {e}; none of it applies: every key takes its default"
        ));
    }
    if let Some(why) = config::unenforced(&c) {
        say(format_args!("GPUSHIM_CONF: {why}"));
    }
    c
}

static MISSING_SAID: AtomicBool = AtomicBool::new(false);

/// A hook whose real function cannot be found: say so once, and fail the call with `code`.
#[cold]
pub fn missing(sym: Sym, code: i32) -> i32 {
    if !MISSING_SAID.swap(true, Ordering::Relaxed) {
        say(format_args!(
            "cannot find the real {} (is the CUDA library loaded?); returning error {code}",
            sym.c_name().to_str().unwrap_or("function")
        ));
    }
    code
}
