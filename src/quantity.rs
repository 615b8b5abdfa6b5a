//! Kubernetes quantities (`20Gi`, `500m`, `1.5`) as plain numbers.

/// Parses a quantity into its value times `scale` (1 for bytes, 1000 for
/// millicores), rounded up as the API server's `MilliValue` and `Value` do.
/// The arithmetic is exact: `2.007` CPUs are 2007 millicores. `None` for text
/// that is not a quantity, for a negative one, and for one too large for `u64`.
pub fn parse_quantity(text: &str, scale: u64) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number = number.strip_prefix('+').unwrap_or(number);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits_ok = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() && fraction.is_empty() || !digits_ok(whole) || !digits_ok(fraction) {
        return None;
    }
    // value = mantissa * 10^exp10 * 2^exp2, kept as integers.
    let mantissa: u128 = format!("{whole}{fraction}").parse().ok()?;
    let mut exp10 = -i32::try_from(fraction.len()).ok()?;
    let mut exp2 = 0u32;
    match suffix {
        "" => {}
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        "Ki" => exp2 = 10,
        "Mi" => exp2 = 20,
        "Gi" => exp2 = 30,
        "Ti" => exp2 = 40,
        "Pi" => exp2 = 50,
        "Ei" => exp2 = 60,
        s if s.starts_with(['e', 'E']) => exp10 += s[1..].parse::<i32>().ok()?,
        _ => return None,
    }
    let mut numerator = mantissa
        .checked_mul(u128::from(scale))?
        .checked_mul(1u128.checked_shl(exp2)?)?;
    let mut denominator: u128 = 1;
    if exp10 >= 0 {
        numerator = numerator.checked_mul(10u128.checked_pow(exp10.unsigned_abs())?)?;
    } else {
        denominator = 10u128.checked_pow(exp10.unsigned_abs())?;
    }
    u64::try_from(numerator.div_ceil(denominator)).ok()
}

/// Bytes as people read them: `31.2 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
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
}
