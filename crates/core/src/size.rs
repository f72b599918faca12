//! Byte sizes as users write them: `8`, `4k`, `64KiB`, `4m`, `1g` (powers of 1024).

/// Parses a size; `None` when it is not a size.
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits == 0 {
        return None;
    }
    let n: usize = s[..digits].parse().ok()?;
    let unit = s[digits..].to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return None,
    };
    n.checked_mul(1usize << shift)
}

/// Formats a size the short way (`4k`, `8m`, `100`).
pub fn format_size(n: usize) -> String {
    for (shift, unit) in [(30, "g"), (20, "m"), (10, "k")] {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("4k"), Some(4096));
        assert_eq!(parse_size("64KiB"), Some(65536));
        assert_eq!(parse_size("4M"), Some(4 << 20));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("k"), None);
        assert_eq!(parse_size("4x"), None);
        assert_eq!(parse_size("99999999999999999999g"), None);
        assert_eq!(format_size(4096), "4k");
        assert_eq!(format_size(4097), "4097");
        assert_eq!(format_size(8 << 20), "8m");
    }
}
