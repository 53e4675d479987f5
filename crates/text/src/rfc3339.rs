//! RFC 3339 text of instants, written by hand: the runner stamps two or three per message,
//! and the `time` crate's general formatter cost as much as the rest of an envelope's fields
//! together. Parsing goes through the `time` crate (it runs only on header values).

use std::fmt;

use serde::Serialize;

/// RFC 3339 in UTC, `YYYY-MM-DDTHH:MM:SS[.fraction]Z`, the fraction with its trailing zeros
/// removed (as the `time` crate writes it). Times outside years 0000-9999, which RFC 3339
/// cannot write, become the epoch.
pub fn format_rfc3339_nanos(unix_nanos: i128) -> String {
    Rfc3339::from_unix_nanos(unix_nanos).as_str().to_string()
}

/// The RFC 3339 text of an instant (see [`format_rfc3339_nanos`]), kept inline: it is at most
/// 30 bytes, and every envelope carries two or three of them.
#[derive(Clone, Copy)]
pub struct Rfc3339 {
    len: u8,
    text: [u8; 30],
}

impl Rfc3339 {
    const EPOCH: Rfc3339 = Rfc3339 {
        len: 20,
        text: *b"1970-01-01T00:00:00Z0000000000",
    };

    pub fn from_unix_nanos(unix_nanos: i128) -> Rfc3339 {
        rfc3339(unix_nanos)
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.text[..usize::from(self.len)]).unwrap_or("")
    }
}

/// Equal when the texts are (bytes past `len` are scratch).
impl PartialEq for Rfc3339 {
    fn eq(&self, other: &Rfc3339) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Rfc3339 {}

impl std::ops::Deref for Rfc3339 {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Rfc3339 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

fn rfc3339(unix_nanos: i128) -> Rfc3339 {
    const NANOS_PER_SECOND: i64 = 1_000_000_000;
    // Seconds of 0000-01-01T00:00:00Z and of 10000-01-01T00:00:00Z.
    const WRITABLE: std::ops::Range<i64> = -62_167_219_200..253_402_300_800;
    // 64-bit arithmetic where it suffices (until 2262); 128-bit division is slow.
    let (secs, nanos) = match i64::try_from(unix_nanos) {
        Ok(n) => (
            n.div_euclid(NANOS_PER_SECOND),
            n.rem_euclid(NANOS_PER_SECOND),
        ),
        Err(_) => {
            let secs = unix_nanos.div_euclid(NANOS_PER_SECOND.into());
            match i64::try_from(secs) {
                Ok(secs) => (secs, unix_nanos.rem_euclid(NANOS_PER_SECOND.into()) as i64),
                Err(_) => return Rfc3339::EPOCH,
            }
        }
    };
    if !WRITABLE.contains(&secs) {
        return Rfc3339::EPOCH;
    }
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let in_day = secs.rem_euclid(86_400) as u32;
    let mut text = *b"0000-00-00T00:00:00.000000000Z";
    put_digits(&mut text[0..4], year as u32);
    put_digits(&mut text[5..7], month);
    put_digits(&mut text[8..10], day);
    put_digits(&mut text[11..13], in_day / 3600);
    put_digits(&mut text[14..16], in_day / 60 % 60);
    put_digits(&mut text[17..19], in_day % 60);
    let len = if nanos == 0 {
        text[19] = b'Z';
        20
    } else {
        put_digits(&mut text[20..29], nanos as u32);
        let mut end = 29;
        while text[end - 1] == b'0' {
            end -= 1;
        }
        text[end] = b'Z';
        end + 1
    };
    Rfc3339 {
        len: len as u8,
        text,
    }
}

/// `00` to `99`.
const PAIRS: [[u8; 2]; 100] = {
    let mut t = [[0u8; 2]; 100];
    let mut i = 0;
    while i < 100 {
        t[i] = [b'0' + (i / 10) as u8, b'0' + (i % 10) as u8];
        i += 1;
    }
    t
};

/// Writes the decimal digits of `n` into `field`, zero-padded to its width (the lowest
/// digits when `n` has more), two digits per division.
fn put_digits(field: &mut [u8], mut n: u32) {
    let mut end = field.len();
    while end >= 2 {
        field[end - 2..end].copy_from_slice(&PAIRS[(n % 100) as usize]);
        n /= 100;
        end -= 2;
    }
    if end == 1 {
        field[0] = b'0' + (n % 10) as u8;
    }
}

/// (year, month, day) of a day count since 1970-01-01 in the proleptic Gregorian calendar
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The instant as a compact UTC stamp without separators, `YYYYMMDDTHHMMSS[.fraction]Z`
/// (RFC 3339's text with `-` and `:` left out): made only of `[0-9TZ.]`, so it can stand in an
/// object key, a header value or a message id as it is.
pub fn compact_utc(unix_nanos: i128) -> String {
    Rfc3339::from_unix_nanos(unix_nanos)
        .as_str()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect()
}

pub fn parse_rfc3339_nanos(text: &str) -> Option<i128> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_by_pairs_are_digits_one_by_one() {
        let one_by_one = |width: usize, mut n: u32| {
            let mut field = vec![0u8; width];
            for digit in field.iter_mut().rev() {
                *digit = b'0' + (n % 10) as u8;
                n /= 10;
            }
            field
        };
        for width in 1..=10 {
            for n in [
                0,
                1,
                9,
                10,
                99,
                100,
                999,
                1_000,
                2026,
                59,
                123_456_789,
                u32::MAX,
            ] {
                let mut field = vec![0u8; width];
                put_digits(&mut field, n);
                assert_eq!(field, one_by_one(width, n), "{width} {n}");
            }
        }
    }

    #[test]
    fn compact_stamps_keep_only_key_safe_characters() {
        let n = parse_rfc3339_nanos("2026-11-28T07:19:43.123456789Z").unwrap();
        assert_eq!(compact_utc(n), "20261128T071943.123456789Z");
        let offset = parse_rfc3339_nanos("2026-11-28T08:19:43.1+01:00").unwrap();
        assert_eq!(compact_utc(offset), "20261128T071943.1Z");
        assert_eq!(compact_utc(0), "19700101T000000Z");
    }

    #[test]
    fn rfc3339_matches_the_time_crate() {
        let by_time_crate = |n: i128| {
            time::OffsetDateTime::from_unix_timestamp_nanos(n)
                .unwrap()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap()
        };
        let mut n: i128 = 1_700_000_000_123_456_789;
        let mut samples = vec![
            0,
            1,
            -1,
            999_999_999,
            1_000_000_000,
            1_000_000_010,
            951_782_400_000_000_000,     // 2000-02-29
            -62_135_596_800_000_000_000, // 0001-01-01
            -62_167_219_200_000_000_000, // 0000-01-01, the first time RFC 3339 can write
            253_402_300_799_999_999_999, // 9999-12-31T23:59:59.999999999
        ];
        // A deterministic spread over years 0-9999 and every fraction length.
        for i in 0..20_000i128 {
            n = n
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407)
                .rem_euclid(315_537_897_600_000_000_000)
                - 62_167_219_200_000_000_000;
            samples.push(n / 10i128.pow((i % 10) as u32) * 10i128.pow((i % 10) as u32));
        }
        for s in samples {
            assert_eq!(format_rfc3339_nanos(s), by_time_crate(s), "{s}");
            assert_eq!(parse_rfc3339_nanos(&format_rfc3339_nanos(s)), Some(s));
            let inline = Rfc3339::from_unix_nanos(s);
            assert_eq!(inline, Rfc3339::from_unix_nanos(s));
            assert_eq!(
                serde_json::to_string(&inline).unwrap(),
                serde_json::to_string(&by_time_crate(s)).unwrap()
            );
        }
        assert_eq!(
            format_rfc3339_nanos(253_402_300_800_000_000_000),
            "1970-01-01T00:00:00Z",
            "year 10000 cannot be written"
        );
        assert_eq!(
            format_rfc3339_nanos(-62_167_219_200_000_000_001),
            "1970-01-01T00:00:00Z"
        );
        // The fallback and the epoch itself are the same text, so they compare equal.
        assert_eq!(
            Rfc3339::from_unix_nanos(253_402_300_800_000_000_000),
            Rfc3339::from_unix_nanos(0)
        );
    }
}
