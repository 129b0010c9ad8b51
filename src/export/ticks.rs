//! The ticks of a chart's axes: round spacings, and labels with as many decimals as they need.

/// A round tick spacing near `raw`: 1, 2, 2.5 or 5 times a power of ten.
pub(super) fn nice_step(raw: f64) -> f64 {
    if !(raw > 0.0 && raw.is_finite()) {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    let nice = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 2.5 {
        2.5
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * p
}

/// A tick value with as many decimals as its step needs (2.5 -> one, 0.25 -> two).
pub(super) fn tick_label(v: f64, step: f64) -> String {
    let decimals = (0..6)
        .find(|&d| {
            let scaled = step * 10f64.powi(d);
            (scaled - scaled.round()).abs() < 1e-6 * scaled.max(1.0)
        })
        .unwrap_or(6) as usize;
    format!("{v:.decimals$}")
}
