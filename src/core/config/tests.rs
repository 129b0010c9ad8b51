//! The settings parsed, refused and explained.

use super::*;

#[test]
fn sizes_take_binary_and_decimal_units() {
    assert_eq!(parse_size("512"), Some(512));
    assert_eq!(parse_size("512MiB"), Some(512 << 20));
    assert_eq!(parse_size("2GiB"), Some(2 << 30));
    assert_eq!(parse_size("2G"), Some(2 << 30));
    assert_eq!(parse_size("24GB"), Some(24_000_000_000));
    assert_eq!(parse_size("1TiB"), Some(1 << 40));
    assert_eq!(parse_size("GiB"), None);
    assert_eq!(parse_size("12 parsecs"), None);
    assert_eq!(parse_size("99999999999999999999T"), None);
}

#[test]
fn medium_takes_a_segment_size_of_at_least_2mib_or_off() {
    assert_eq!(parse_strict("medium:20MiB").unwrap().medium, 20 * MIB);
    assert_eq!(parse_strict("medium:off").unwrap().medium, 0);
    assert_eq!(Conf::default().medium, 0);
    assert!(parse_strict("medium:1MiB").is_err());
    assert!(parse_strict("medium:0").is_err());
    assert!(parse_strict("medium:lots").is_err());
}

#[test]
fn a_full_policy_parses() {
    let c = parse_strict(
        "pool:caching, round:pow2_4,max_split:512MiB,release:2GiB,limit:24GiB,trace_max:1GiB",
    )
    .unwrap();
    assert_eq!(c.pool, Pool::Caching);
    assert_eq!(c.round, 4);
    assert_eq!(c.max_split, 512 * MIB);
    assert_eq!(c.release, 2 * GIB);
    assert_eq!(c.limit, 24 * GIB);
    assert_eq!(c.trace_max, GIB);
    let stacks = |t: &str| {
        let s = parse_strict(t).unwrap().stacks;
        (s.native_every(), s.python(), s.native_without_python())
    };
    assert_eq!(stacks("stacks:on"), (1, true, false));
    assert_eq!(stacks("stacks:native"), (1, false, false));
    assert_eq!(stacks("stacks:python"), (0, true, false));
    assert_eq!(stacks("stacks:auto"), (0, true, true));
    assert_eq!(stacks(""), (0, true, true), "auto by default");
    assert_eq!(stacks("stacks:off"), (0, false, false));
    assert_eq!(stacks("stacks:100"), (100, true, false));
    assert!(parse_strict("stacks:0").is_err());
}

#[test]
fn an_unknown_key_names_itself_and_every_known_key_and_falls_back_to_defaults() {
    let (c, e) = parse("limit:1GiB,pol:off");
    assert_eq!(c, Conf::default());
    let msg = e.unwrap().to_string();
    assert!(msg.contains("'pol'"), "{msg}");
    for d in KEYS {
        assert!(msg.contains(d.key), "{msg} should list {}", d.key);
    }
}

#[test]
fn a_misspelt_key_gets_the_nearest_and_a_wrong_separator_is_named() {
    let e = parse_strict("pools:caching").unwrap_err().to_string();
    assert!(
        e.starts_with("unknown key 'pools' (did you mean 'pool'?); the keys: "),
        "{e}"
    );
    let e = parse_strict("trace_mx:1GiB").unwrap_err().to_string();
    assert!(e.contains("(did you mean 'trace_max'?)"), "{e}");
    // Nothing near: no guess.
    let e = parse_strict("colour:red").unwrap_err().to_string();
    assert!(!e.contains("did you mean"), "{e}");
    let e = parse_strict("pool=caching").unwrap_err().to_string();
    assert_eq!(
        e,
        "'pool=caching': a key and its value are joined by ':', as in 'pool:caching'"
    );
    // The shim words it in a fixed buffer: the longest message fits its line.
    let mut b = crate::fixedfmt::FixedBuf::<512>::new();
    core::fmt::Write::write_fmt(&mut b, format_args!("{}", ConfError::UnknownKey("pools")))
        .unwrap();
    assert!(b.as_bytes().ends_with(KEYS[KEYS.len() - 1].key.as_bytes()));
}

#[test]
fn a_bad_value_names_the_key_the_value_and_what_is_accepted() {
    let e = parse_strict("pool:cachng").unwrap_err();
    assert_eq!(
        e.to_string(),
        "'pool:cachng' is not valid (pool takes off, caching, expandable)"
    );
    let e = parse_strict("round:pow2_3").unwrap_err();
    assert!(e.to_string().contains("pow2_N"), "{e}");
    assert_eq!(
        parse_strict("limit").unwrap_err(),
        ConfError::MissingValue("limit")
    );
}

#[test]
fn limit_zero_is_refused_and_trim_takes_durations() {
    assert!(parse_strict("limit:0").is_err());
    // A bare number under a MiB is a unit forgotten (24 meant as GiB), refused; over, bytes.
    assert!(parse_strict("limit:24").is_err());
    assert_eq!(parse_strict("limit:2097152").unwrap().limit, 2 << 20);
    assert!(parse_strict("limit:0GiB").is_err());
    assert_eq!(parse_strict("limit:off").unwrap().limit, 0);
    let trim = |t: &str| parse_strict(t).unwrap().trim;
    assert_eq!(trim("trim:250ms"), Trim::After(250_000_000));
    assert_eq!(trim("trim:2s"), Trim::After(2_000_000_000));
    assert_eq!(trim("trim:0"), Trim::After(0));
    assert_eq!(trim("trim:off"), Trim::Off);
    assert_eq!(trim("trim:off").age_ns(), u64::MAX);
    assert!(parse_strict("trim:soon").is_err());
    assert_eq!(Conf::default().trim, Trim::Auto);
    assert_eq!(trim("trim:auto"), Trim::Auto);
}

/// Each row's default is a value it accepts, and it gives the field `Conf::DEFAULT` has: the
/// row `gpushim config` shows and the value the shim runs with cannot drift apart.
#[test]
fn each_keys_default_text_gives_the_default() {
    for row in KEYS {
        let mut c = Conf::DEFAULT;
        assert_eq!((row.apply)(&mut c, row.default), Some(()), "{}", row.key);
        assert_eq!(
            c,
            Conf::DEFAULT,
            "{}:{} is not the default",
            row.key,
            row.default
        );
        assert!(
            row.accepted.len() > 2 && row.meaning.len() > 10,
            "{}",
            row.key
        );
    }
    // And a row applies its own key only: a value changes one field.
    let mut c = Conf::DEFAULT;
    (KEYS.iter().find(|r| r.key == "medium").unwrap().apply)(&mut c, "20MiB").unwrap();
    assert_eq!(Conf { medium: 0, ..c }, Conf::DEFAULT);
}

#[test]
fn empty_items_are_ignored() {
    assert_eq!(parse_strict(" , ,").unwrap(), Conf::default());
}
