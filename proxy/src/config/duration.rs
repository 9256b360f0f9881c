//! Durations in the configuration: numbers with a unit, such as `"250ms"`, `"30s"` or `"1m30s"`.
//!
//! Stricter than `humantime`, whose words (`"1 minute"`) and month unit (`"1M"`, a month, next to
//! `"1m"`, a minute) make a typo a valid and very different value.

use std::time::Duration;

use serde::{Deserialize, Deserializer, de};

/// The units a duration may use, longest first so `ms` is not read as `m`.
const UNITS: &[(&str, Duration)] = &[
    ("ms", Duration::from_millis(1)),
    ("us", Duration::from_micros(1)),
    ("ns", Duration::from_nanos(1)),
    ("s", Duration::from_secs(1)),
    ("m", Duration::from_secs(60)),
    ("h", Duration::from_secs(3600)),
    ("d", Duration::from_secs(86_400)),
];

/// Why a duration was refused: the text and how to write it.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid duration {0:?}: write numbers with a unit (ms, s, m, h or d), such as \"500ms\", \
     \"30s\" or \"1m30s\""
)]
pub struct InvalidDuration(pub String);

/// Parses `"1m30s"`-style text: one or more numbers, each followed at once by a unit; spaces
/// may separate the parts (`"1m 30s"`, as `humantime` prints them).
pub fn parse(text: &str) -> Result<Duration, InvalidDuration> {
    let refused = || InvalidDuration(text.to_owned());
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(refused());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let n: u32 = rest[..digits].parse().map_err(|_| refused())?;
        rest = &rest[digits..];
        let (unit, size) = UNITS
            .iter()
            .find(|(u, _)| {
                rest.strip_prefix(u)
                    .is_some_and(|after| !after.starts_with(|c: char| c.is_ascii_alphabetic()))
            })
            .ok_or_else(refused)?;
        total = size
            .checked_mul(n)
            .and_then(|part| total.checked_add(part))
            .ok_or_else(refused)?;
        rest = rest[unit.len()..].trim_start();
    }
    Ok(total)
}

/// A configuration field holding a duration (or an optional one).
pub trait DurationField: Sized {
    /// Reads the field's text and parses it.
    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error>;
}

impl DurationField for Duration {
    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text).map_err(de::Error::custom)
    }
}

impl DurationField for Option<Duration> {
    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| parse(&t).map_err(de::Error::custom))
            .transpose()
    }
}

/// For `#[serde(with = "…::duration")]`.
pub fn deserialize<'de, D: Deserializer<'de>, T: DurationField>(d: D) -> Result<T, D::Error> {
    T::read(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_with_units() {
        let s = Duration::from_secs;
        assert_eq!(parse("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse("30s").unwrap(), s(30));
        assert_eq!(parse("1m30s").unwrap(), s(90));
        assert_eq!(parse("1m 30s").unwrap(), s(90));
        assert_eq!(parse("2h").unwrap(), s(7200));
        assert_eq!(parse("1d").unwrap(), s(86_400));
        assert_eq!(parse("0s").unwrap(), Duration::ZERO);
    }

    #[test]
    fn words_and_lookalikes_are_refused() {
        for bad in [
            "", "1 minute", "1minute", "1 m", "1M", "60", "s", "1.5s", "-1s", "banana", "1sec",
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains("such as \"500ms\""), "{bad:?}: {err}");
        }
    }
}
