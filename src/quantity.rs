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
#[path = "quantity_tests.rs"]
mod tests;
