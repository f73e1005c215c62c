//! `strftime` on a fixed UTC time, for templates' `strftime_now`: the C library's
//! conversions in the C locale (English names), as Python's `datetime.strftime` gives
//! them, including glibc's `%-d` (no padding).

use std::fmt::Write;

const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A UTC time broken into its fields.
struct Civil {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    /// 0 = Monday.
    weekday: u32,
    /// 1-based day of the year.
    yday: u32,
}

fn civil(seconds: i64) -> Civil {
    let days = seconds.div_euclid(86_400);
    let secs = seconds.rem_euclid(86_400) as u32;
    let (year, month, day) = crate::source::civil_from_days(days);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334][month as usize - 1];
    let yday = before + day + u32::from(leap && month > 2);
    Civil {
        year,
        month,
        day,
        hour: secs / 3600,
        minute: secs / 60 % 60,
        second: secs % 60,
        // 1970-01-01 was a Thursday.
        weekday: (days + 3).rem_euclid(7) as u32,
        yday,
    }
}

/// `format` applied to the UTC time `seconds` after the Unix epoch.
pub fn strftime(format: &str, seconds: i64) -> Result<String, String> {
    let t = civil(seconds);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next().ok_or("a format that ends in %")?;
        let pad = spec != '-';
        if !pad {
            spec = chars.next().ok_or("a format that ends in %-")?;
        }
        let num = |out: &mut String, n: i64, width: usize| {
            let _ = if pad {
                write!(out, "{n:0width$}")
            } else {
                write!(out, "{n}")
            };
        };
        match spec {
            'Y' => {
                let _ = write!(out, "{}", t.year);
            }
            'y' => num(&mut out, t.year.rem_euclid(100), 2),
            'm' => num(&mut out, t.month.into(), 2),
            'd' => num(&mut out, t.day.into(), 2),
            'e' => {
                let _ = write!(out, "{:2}", t.day);
            }
            'j' => num(&mut out, t.yday.into(), 3),
            'H' => num(&mut out, t.hour.into(), 2),
            'I' => num(&mut out, ((t.hour + 11) % 12 + 1).into(), 2),
            'M' => num(&mut out, t.minute.into(), 2),
            'S' => num(&mut out, t.second.into(), 2),
            'p' => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            'a' => out.push_str(&DAYS[t.weekday as usize][..3]),
            'A' => out.push_str(DAYS[t.weekday as usize]),
            'b' | 'h' => out.push_str(&MONTHS[t.month as usize - 1][..3]),
            'B' => out.push_str(MONTHS[t.month as usize - 1]),
            'u' => num(&mut out, (t.weekday + 1).into(), 1),
            'w' => num(&mut out, ((t.weekday + 1) % 7).into(), 1),
            'F' => {
                let _ = write!(out, "{}-{:02}-{:02}", t.year, t.month, t.day);
            }
            'T' => {
                let _ = write!(out, "{:02}:{:02}:{:02}", t.hour, t.minute, t.second);
            }
            'Z' => out.push_str("UTC"),
            'z' => out.push_str("+0000"),
            '%' => out.push('%'),
            other => return Err(format!("strftime_now: %{other} is not supported")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_the_c_librarys() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d", t).unwrap(), "2024-02-29");
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "29 Feb 2024");
        assert_eq!(
            strftime("%A %B %-d %H:%M:%S %j %I%p", t).unwrap(),
            "Thursday February 29 13:05:09 060 01PM"
        );
        assert_eq!(strftime("%Y-%m-%d %a", 0).unwrap(), "1970-01-01 Thu");
        assert_eq!(strftime("%Y-%m-%d", -86_400).unwrap(), "1969-12-31");
    }
}
