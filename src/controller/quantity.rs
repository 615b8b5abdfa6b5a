//! Kubernetes quantities (`20Gi`, `500m`, `1.5`) as plain numbers.

/// Parses a quantity into its value times `scale` (1 for bytes, 1000 for
/// millicores), rounded up. `None` for text that is not a quantity.
pub fn parse_quantity(text: &str, scale: f64) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        "Pi" => 1024.0f64.powi(5),
        "Ei" => 1024.0f64.powi(6),
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    let value = number * factor * scale;
    (value.is_finite() && value >= 0.0).then(|| value.ceil() as u64)
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
            ("20Gi", 1.0, Some(20 * 1024 * 1024 * 1024)),
            ("500m", 1000.0, Some(500)),
            ("4", 1000.0, Some(4000)),
            ("1.5", 1000.0, Some(1500)),
            ("128974848", 1.0, Some(128_974_848)),
            ("129e6", 1.0, Some(129_000_000)),
            ("123Mi", 1.0, Some(128_974_848)),
            ("1k", 1.0, Some(1000)),
            ("20 gigs", 1.0, None),
            ("Gi", 1.0, None),
            ("-1Gi", 1.0, None),
        ];
        for (text, scale, expected) in cases {
            assert_eq!(parse_quantity(text, scale), expected, "{text}");
        }
    }

    #[test]
    fn bytes_print_in_binary_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(31_200 * 1024 * 1024), "30.5 GiB");
        assert_eq!(human_bytes(24 * 1024 * 1024 * 1024), "24.0 GiB");
    }
}
