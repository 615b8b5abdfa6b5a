use super::*;

#[test]
fn quantities_parse_with_binary_and_decimal_suffixes() {
    let cases = [
        ("20Gi", 1, Some(20 * 1024 * 1024 * 1024)),
        ("500m", 1000, Some(500)),
        ("4", 1000, Some(4000)),
        ("1.5", 1000, Some(1500)),
        // Exact, not through a float: 2.007 * 1000 is 2007.
        ("2.007", 1000, Some(2007)),
        ("0.1", 1000, Some(100)),
        ("4.1", 1000, Some(4100)),
        ("1.1Gi", 1, Some(1_181_116_007)),
        ("0.3", 10, Some(3)),
        // Rounded up, as the API server rounds a MilliValue.
        ("0.0001", 1000, Some(1)),
        ("1500u", 1000, Some(2)),
        ("250000000n", 1000, Some(250)),
        ("2.5m", 1000, Some(3)),
        ("128974848", 1, Some(128_974_848)),
        ("129e6", 1, Some(129_000_000)),
        ("1E3", 1, Some(1000)),
        ("5e-1", 1000, Some(500)),
        ("+3", 1, Some(3)),
        (".5", 1000, Some(500)),
        ("123Mi", 1, Some(128_974_848)),
        ("1k", 1, Some(1000)),
        ("2M", 1, Some(2_000_000)),
        ("1G", 1, Some(1_000_000_000)),
        ("1T", 1, Some(1_000_000_000_000)),
        ("1P", 1, Some(1_000_000_000_000_000)),
        ("1E", 1, Some(1_000_000_000_000_000_000)),
        ("1Ki", 1, Some(1024)),
        ("1Ti", 1, Some(1 << 40)),
        ("1Pi", 1, Some(1 << 50)),
        ("1Ei", 1, Some(1 << 60)),
        ("16Ei", 1, None),
        ("20 gigs", 1, None),
        ("Gi", 1, None),
        (".", 1, None),
        ("1.2.3", 1, None),
        ("-1Gi", 1, None),
        ("1-2", 1, None),
    ];
    for (text, scale, expected) in cases {
        assert_eq!(parse_quantity(text, scale), expected, "{text}");
    }
}

#[test]
fn only_e_takes_an_exponent_and_a_number_has_one_sign_and_digits_around_its_point() {
    for text in ["1x3", "1y", "++5", "+-5", "1.+5", "1.-5", "1e", "1e+"] {
        assert_eq!(parse_quantity(text, 1), None, "{text}");
    }
}

#[test]
fn bytes_print_in_binary_units() {
    assert_eq!(human_bytes(512), "512 B");
    assert_eq!(human_bytes(31_200 * 1024 * 1024), "30.5 GiB");
    assert_eq!(human_bytes(24 * 1024 * 1024 * 1024), "24.0 GiB");
}

#[test]
fn tib_is_the_largest_unit() {
    assert_eq!(human_bytes(1023), "1023 B");
    assert_eq!(human_bytes(1024), "1.0 KiB");
    assert_eq!(human_bytes(2048 << 40), "2048.0 TiB");
    assert_eq!(human_bytes(u64::MAX), "16777216.0 TiB");
}
