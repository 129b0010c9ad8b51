//! Sizes and durations as the reports write them (one home for every report and picture).

/// The widest a text column is padded to: a name from a trace or a saved analysis can be of
/// any length, and a padding width over 65,535 aborts Rust's formatting; a longer name runs
/// past its column.
pub const COLUMN_MAX: usize = 80;

/// `width` as a column's padding, at most [`COLUMN_MAX`].
pub fn column(width: usize) -> usize {
    width.min(COLUMN_MAX)
}

/// `1.50 GiB`, `512 B`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

pub fn human_duration(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.2} ms", ns as f64 / 1e6)
    } else {
        format!("{:.1} µs", ns as f64 / 1e3)
    }
}

/// Fragmentation: the share of reserved memory not live (0 with nothing reserved).
pub fn fragmentation(live: u64, reserved: u64) -> f64 {
    if reserved > 0 {
        1.0 - live as f64 / reserved as f64
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_read_as_people_write_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 19), "1.50 MiB");
        assert_eq!(human_duration(1_500_000), "1.50 ms");
        assert_eq!(human_duration(2_000_000_000), "2.00 s");
        assert_eq!(fragmentation(1, 4), 0.75);
        assert_eq!(fragmentation(0, 0), 0.0);
    }
}
