//! The recorder's file, claims and interning, shown on temporary files.

use super::*;

#[test]
fn patterns_expand_pid_host_rank_and_percent() {
    let mut out = [0u8; 128];
    let n = expand_pattern(b"/tmp/t.%h.%r.%p.%%", 4242, b"node7", 3, &mut out).unwrap();
    assert_eq!(&out[..n], b"/tmp/t.node7.3.4242.%");
}

#[test]
fn bad_patterns_are_refused_with_a_reason() {
    let mut out = [0u8; 16];
    assert_eq!(
        expand_pattern(b"t.%x", 1, b"h", 0, &mut out),
        Err(PatternError::UnknownEscape(b'x'))
    );
    assert_eq!(
        expand_pattern(b"t.%", 1, b"h", 0, &mut out),
        Err(PatternError::TrailingPercent)
    );
    assert_eq!(
        expand_pattern(b"a-very-long-file-name", 1, b"h", 0, &mut out),
        Err(PatternError::TooLong)
    );
}

#[test]
fn streams_intern_to_stable_distinct_indices() {
    let r = Recorder::new();
    assert_eq!(r.intern_stream(0), (0, false));
    let (a, new_a) = r.intern_stream(0xdead_0000);
    let (b, new_b) = r.intern_stream(0xbeef_0000);
    assert!(new_a && new_b);
    assert_ne!(a, b);
    assert_eq!(r.intern_stream(0xdead_0000), (a, false));
}

#[test]
fn ints_format_in_decimal() {
    let mut b = [0u8; 24];
    assert_eq!(format_int(0, &mut b), b"0");
    assert_eq!(format_int(-12, &mut b), b"-12");
    assert_eq!(format_int(i64::MAX, &mut b), b"9223372036854775807");
}
