//! Process-wide settings, read once: the off switch, and everything else in one value
//! ([`Settings`]).

use crate::cuda::symbols::Sym;
use crate::os::say;
use core::cell::UnsafeCell;
use core::ffi::CStr;
use core::mem::MaybeUninit;

use core::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use gpushim_core::config::{self, Conf};

static ENABLED: crate::os::LazyFlag = crate::os::LazyFlag::new();

/// `false` when `GPUSHIM_DISABLE` is set to anything but `0` or empty: then every hook only
/// forwards, `dlsym` and the entry-point lookups hand out the real functions, and nothing is
/// written. Safe inside `dlsym` and constructors: no allocation, no lock.
pub fn enabled() -> bool {
    ENABLED.get(|| !crate::options::Switch::Disable.on())
}

/// Every setting of the shim but the off switch, resolved once, at first use, and read from
/// here by every layer: the configuration and each environment switch (`options`). The off
/// switch stays apart ([`enabled`]): `dlsym` and constructors ask it, and it must be answered
/// there without parsing anything or printing.
#[derive(Clone, Copy)]
pub struct Settings {
    /// `GPUSHIM_CONF`, parsed (the defaults where it is bad, said once).
    pub conf: Conf,
    /// `GPUSHIM_TRACE`: the trace path pattern (`None`: the default; `off`: no trace).
    pub trace: Option<&'static CStr>,
    /// `GPUSHIM_RUN_REPORT`: the folder `gpushim run` reads its processes' notes from.
    pub run_report: Option<&'static CStr>,
    /// `GPUSHIM_COSTS`: the shim's own costs measured, a table at exit.
    pub costs: bool,
    /// `GPUSHIM_CTX_EVENTS`: checkpoints as one context-wide event (default off).
    pub ctx_events: bool,
    /// `GPUSHIM_SEAL_SPACING` (1 to 1024), for measuring; `None` when unset or out of range.
    pub seal_spacing: Option<u64>,
}

struct SettingsCell(UnsafeCell<MaybeUninit<Settings>>);
// SAFETY: written once by the thread that moves SETTINGS_STATE from 0 to 1, read only after
// SETTINGS_STATE is 2 (Release/Acquire).
unsafe impl Sync for SettingsCell {}

static SETTINGS: SettingsCell = SettingsCell(UnsafeCell::new(MaybeUninit::uninit()));
static SETTINGS_STATE: AtomicU8 = AtomicU8::new(0);

/// The shim's settings (see [`Settings`]), resolved by the first caller; others wait for it
/// (a spin of microseconds, once). No allocation.
pub fn settings() -> &'static Settings {
    loop {
        match SETTINGS_STATE.compare_exchange(0, 1, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => {
                let s = resolve();
                // SAFETY: we won the 0 -> 1 transition; nobody reads SETTINGS before state 2.
                unsafe { (*SETTINGS.0.get()).write(s) };
                SETTINGS_STATE.store(2, Ordering::Release);
            }
            Err(2) => {
                // SAFETY: state 2 was published with Release after the value was written.
                return unsafe { (*SETTINGS.0.get()).assume_init_ref() };
            }
            Err(_) => core::hint::spin_loop(),
        }
    }
}

fn resolve() -> Settings {
    use crate::options::Switch;
    Settings {
        conf: read_conf(),
        trace: Switch::Trace.value(),
        run_report: Switch::RunReport.value(),
        costs: Switch::Costs.on(),
        ctx_events: Switch::CtxEvents.value().is_some() && Switch::CtxEvents.on(),
        seal_spacing: Switch::SealSpacing
            .value()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|n| (1..=1024).contains(n)),
    }
}

/// The configuration from `GPUSHIM_CONF` ([`Settings::conf`]).
pub fn conf() -> Conf {
    settings().conf
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
