//! Go's `time.ParseDuration` syntax (`300ms`, `1m30s`, `1.5h`), so Reloader command lines and
//! annotations such as `pause-period` keep working. No crate parses exactly this syntax.

use std::time::Duration;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {input:?}: {why} (examples: 250ms, 30s, 1m30s, 2h)")]
pub struct DurationError {
    pub input: String,
    pub why: &'static str,
}

pub fn parse_go_duration(input: &str) -> Result<Duration, DurationError> {
    let err = |why| DurationError {
        input: input.to_string(),
        why,
    };
    let s = input.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(err("negative durations are not allowed"));
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(err("empty"));
    }
    let mut rest = s;
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_len);
        if num.is_empty() || num == "." {
            return Err(err("expected a number"));
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(err("missing unit")),
            _ => return Err(err("unknown unit")),
        };
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if frac.contains('.') {
            return Err(err("expected a number"));
        }
        let int: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| err("number too large"))?
        };
        let mut nanos = int
            .checked_mul(unit_nanos)
            .ok_or_else(|| err("number too large"))?;
        let mut scale = unit_nanos;
        for d in frac.bytes().take(18) {
            scale /= 10;
            nanos += u128::from(d - b'0') * scale;
        }
        total_nanos = total_nanos
            .checked_add(nanos)
            .ok_or_else(|| err("number too large"))?;
        rest = next;
    }
    u64::try_from(total_nanos)
        .map(Duration::from_nanos)
        .map_err(|_| err("number too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_syntax() {
        let ok = [
            ("0", 0),
            ("250ms", 250_000_000),
            ("30s", 30_000_000_000),
            ("1m30s", 90_000_000_000),
            ("1.5h", 5_400_000_000_000),
            ("2h45m", 9_900_000_000_000),
            ("10us", 10_000),
            ("1µs", 1_000),
            (".5s", 500_000_000),
            ("0s", 0),
        ];
        for (s, nanos) in ok {
            assert_eq!(parse_go_duration(s), Ok(Duration::from_nanos(nanos)), "{s}");
        }
        for bad in ["", "10", "1x", "-1s", "s", "1..5s", "1m30", "abc"] {
            assert!(parse_go_duration(bad).is_err(), "{bad} should fail");
        }
    }
}
