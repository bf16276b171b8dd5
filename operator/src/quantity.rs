//! Kubernetes quantities (`resource.Quantity`: "40192Mi", "98", "1.5", "500m", "2e3") as exact
//! integers of nano-units, for arithmetic on device counters. CEL's `quantity()` (kube-cel)
//! compares quantities inside expressions; this is for sums outside them.
//!
//! The grammar is apimachinery's (`staging/src/k8s.io/apimachinery/pkg/api/resource/quantity.go`,
//! `ParseQuantity`): an optional sign, digits with an optional fraction, then a binary suffix
//! (Ki … Ei), a decimal one (n, u, m, "", k, M, G, T, P, E) or an exponent (e3, E-2). Like
//! Kubernetes, a value finer than a nano-unit is rounded up.

/// A quantity that cannot be parsed, or does not fit 128 bits of nano-units.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a quantity: {reason}")]
pub struct QuantityError {
    pub value: String,
    pub reason: &'static str,
}

/// Nano-units per unit.
pub const NANOS: i128 = 1_000_000_000;

/// `value` in nano-units.
pub fn parse_nanos(value: &str) -> Result<i128, QuantityError> {
    let fail = |reason| QuantityError {
        value: value.to_owned(),
        reason,
    };
    let s = value.trim();
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(fail("no digits"));
    }
    if fraction.contains('.') {
        return Err(fail("two decimal points"));
    }
    // mantissa × 10^exponent10 × 1024^exponent2.
    let digits = format!("{whole}{fraction}");
    let mantissa: i128 = digits.parse().map_err(|_| fail("too many digits"))?;
    let mut exponent10 = -i32::try_from(fraction.len()).map_err(|_| fail("too many digits"))?;
    let mut exponent2 = 0u32;
    match suffix {
        "Ki" => exponent2 = 1,
        "Mi" => exponent2 = 2,
        "Gi" => exponent2 = 3,
        "Ti" => exponent2 = 4,
        "Pi" => exponent2 = 5,
        "Ei" => exponent2 = 6,
        "n" => exponent10 -= 9,
        "u" => exponent10 -= 6,
        "m" => exponent10 -= 3,
        "" => {}
        "k" => exponent10 += 3,
        "M" => exponent10 += 6,
        "G" => exponent10 += 9,
        "T" => exponent10 += 12,
        "P" => exponent10 += 15,
        "E" => exponent10 += 18,
        exponent if exponent.starts_with(['e', 'E']) => {
            let e: i32 = exponent[1..].parse().map_err(|_| fail("bad exponent"))?;
            exponent10 += e;
        }
        _ => return Err(fail("unknown suffix")),
    }
    let too_large = || fail("too large");
    let mut nanos = mantissa
        .checked_mul(1024i128.pow(exponent2))
        .ok_or_else(too_large)?;
    let scale = exponent10 + 9;
    if scale >= 0 {
        let factor = 10i128
            .checked_pow(scale.unsigned_abs())
            .ok_or_else(too_large)?;
        nanos = nanos.checked_mul(factor).ok_or_else(too_large)?;
    } else {
        // Finer than a nano-unit: rounded up, as Kubernetes does.
        let divisor = 10i128
            .checked_pow(scale.unsigned_abs())
            .unwrap_or(i128::MAX);
        nanos = nanos / divisor + i128::from(nanos % divisor != 0);
    }
    Ok(if negative { -nanos } else { nanos })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_apimachinery_reads_them() {
        let cases: &[(&str, i128)] = &[
            ("98", 98 * NANOS),
            ("0", 0),
            ("40192Mi", 40192 * 1024 * 1024 * NANOS),
            ("40Gi", 40 * (1 << 30) * NANOS),
            ("1.5", 1_500_000_000),
            ("500m", 500_000_000),
            ("2e3", 2000 * NANOS),
            ("1E-3", 1_000_000),
            ("3k", 3000 * NANOS),
            ("-2", -2 * NANOS),
            ("1n", 1),
            ("0.5n", 1),
            (".5", 500_000_000),
            ("1Ei", (1i128 << 60) * NANOS),
        ];
        for (text, nanos) in cases {
            assert_eq!(parse_nanos(text), Ok(*nanos), "{text}");
        }
    }

    #[test]
    fn what_is_no_quantity_is_refused_with_the_reason() {
        for (text, reason) in [
            ("", "no digits"),
            ("Gi", "no digits"),
            ("1.2.3", "two decimal points"),
            ("4GB", "unknown suffix"),
            ("1e", "bad exponent"),
            ("1e40", "too large"),
        ] {
            assert_eq!(
                parse_nanos(text).map_err(|e| e.reason),
                Err(reason),
                "{text}"
            );
        }
    }
}
