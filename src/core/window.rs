//! Reload windows (`rekindle.io/reload-window`, `--reload-window`): when a reload may start.
//!
//! A value is one or more windows separated by `;`, each `DAYS HH:MM-HH:MM [ZONE]`:
//! - DAYS: `*` (every day), or days and ranges separated by `,` (`Mon-Fri`, `Sat,Sun`, `Fri-Mon`);
//! - HH:MM-HH:MM: the start and the end, on a 24-hour clock; an end at or before the start crosses
//!   midnight (`22:00-02:00` opens on DAYS at 22:00 and closes the next morning);
//! - ZONE: an IANA time zone (`Europe/Berlin`); UTC when absent.
//!
//! The days are the days a window opens on. Times are wall-clock times in the zone; a time that a
//! daylight-saving jump skips moves forward by the jump (02:30 on the spring-forward night is 03:30).

use std::fmt;
use std::str::FromStr;

use jiff::civil::{Date, Time, Weekday};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// On a workload: when its reloads may start (overrides `--reload-window`).
pub const RELOAD_WINDOW_ANNOTATION: &str = "rekindle.io/reload-window";

/// Every window of one value; open when any is.
#[derive(Debug, Clone, PartialEq)]
pub struct Windows(Vec<Window>);

#[derive(Debug, Clone, PartialEq)]
struct Window {
    /// Opens on these days, Monday first.
    days: [bool; 7],
    start: Time,
    end: Time,
    zone: TimeZone,
    /// As written, for messages.
    text: String,
}

/// Why a value is not a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowError(pub String);

impl fmt::Display for WindowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WindowError {}

const DAYS: [(&str, &str); 7] = [
    ("mon", "monday"),
    ("tue", "tuesday"),
    ("wed", "wednesday"),
    ("thu", "thursday"),
    ("fri", "friday"),
    ("sat", "saturday"),
    ("sun", "sunday"),
];

/// Monday is 0; `Mon` and `Monday` in any case.
fn day(s: &str) -> Result<usize, WindowError> {
    let lower = s.to_ascii_lowercase();
    DAYS.iter()
        .position(|(short, full)| lower == *short || lower == *full)
        .ok_or_else(|| WindowError(format!("{s:?} is not a day (Mon, Tue, ... Sun)")))
}

fn days(s: &str) -> Result<[bool; 7], WindowError> {
    if s == "*" {
        return Ok([true; 7]);
    }
    let mut out = [false; 7];
    for part in s.split(',') {
        match part.split_once('-') {
            Some((from, to)) => {
                let (from, to) = (day(from)?, day(to)?);
                // A range may wrap the week: Fri-Mon is Fri, Sat, Sun, Mon.
                let mut d = from;
                loop {
                    out[d] = true;
                    if d == to {
                        break;
                    }
                    d = (d + 1) % 7;
                }
            }
            None => out[day(part)?] = true,
        }
    }
    Ok(out)
}

fn time(s: &str) -> Result<Time, WindowError> {
    let bad = || {
        WindowError(format!(
            "{s:?} is not a time of day (HH:MM, 00:00 to 23:59)"
        ))
    };
    let (h, m) = s.split_once(':').ok_or_else(bad)?;
    if h.is_empty() || h.len() > 2 || m.len() != 2 {
        return Err(bad());
    }
    let h: i8 = h.parse().map_err(|_| bad())?;
    let m: i8 = m.parse().map_err(|_| bad())?;
    Time::new(h, m, 0, 0).map_err(|_| bad())
}

impl FromStr for Window {
    type Err = WindowError;

    fn from_str(s: &str) -> Result<Self, WindowError> {
        let fields: Vec<&str> = s.split_whitespace().collect();
        let (days_text, span, zone) = match fields.as_slice() {
            [d, t] => (*d, *t, None),
            [d, t, z] => (*d, *t, Some(*z)),
            _ => {
                return Err(WindowError(format!(
                    "{s:?} is not a window: expected DAYS HH:MM-HH:MM [ZONE]"
                )))
            }
        };
        let (start, end) = span.split_once('-').ok_or_else(|| {
            WindowError(format!("{span:?} is not a time span: expected HH:MM-HH:MM"))
        })?;
        let (start, end) = (time(start)?, time(end)?);
        if start == end {
            return Err(WindowError(format!(
                "{span:?} is empty: the start and the end are the same time"
            )));
        }
        let zone = match zone {
            None => TimeZone::UTC,
            Some(name) => TimeZone::get(name)
                .map_err(|_| WindowError(format!("{name:?} is not a known IANA time zone")))?,
        };
        Ok(Window {
            days: days(days_text)?,
            start,
            end,
            zone,
            text: s.trim().to_string(),
        })
    }
}

impl FromStr for Windows {
    type Err = WindowError;

    fn from_str(s: &str) -> Result<Self, WindowError> {
        let windows = s
            .split(';')
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .map(Window::from_str)
            .collect::<Result<Vec<_>, _>>()?;
        if windows.is_empty() {
            return Err(WindowError("no window given".into()));
        }
        Ok(Windows(windows))
    }
}

impl fmt::Display for Windows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let texts: Vec<&str> = self.0.iter().map(|w| w.text.as_str()).collect();
        f.write_str(&texts.join("; "))
    }
}

impl Window {
    /// The opening and closing instants of the window that opens on `date` (in its zone), if it
    /// opens that day.
    fn on(&self, date: Date) -> Option<(Timestamp, Timestamp)> {
        if !self.days[weekday_index(date.weekday())] {
            return None;
        }
        let end_date = if self.end <= self.start {
            date.tomorrow().ok()?
        } else {
            date
        };
        let open = date
            .to_datetime(self.start)
            .to_zoned(self.zone.clone())
            .ok()?;
        let close = end_date
            .to_datetime(self.end)
            .to_zoned(self.zone.clone())
            .ok()?;
        Some((open.timestamp(), close.timestamp()))
    }

    /// `None` when open at `now`; otherwise when it next opens.
    fn opens_at(&self, now: Timestamp) -> Option<Timestamp> {
        let today = now.to_zoned(self.zone.clone()).date();
        // Yesterday's window may still be open (crossing midnight); a week ahead always has one.
        let mut next = None;
        for offset in -1..=7i64 {
            let Ok(date) = today.checked_add(offset.days()) else {
                continue;
            };
            let Some((open, close)) = self.on(date) else {
                continue;
            };
            if open <= now && now < close {
                return None;
            }
            if open > now && next.is_none_or(|n| open < n) {
                next = Some(open);
            }
        }
        // Unreachable with at least one day chosen; "open" is the safe answer if it ever were.
        next
    }
}

fn weekday_index(w: Weekday) -> usize {
    w.to_monday_zero_offset() as usize
}

impl Windows {
    /// `None` when a window is open at `now`; otherwise when the first one opens.
    pub fn opens_at(&self, now: Timestamp) -> Option<Timestamp> {
        let mut first: Option<Timestamp> = None;
        for w in &self.0 {
            let at = w.opens_at(now)?;
            first = Some(first.map_or(at, |f| f.min(at)));
        }
        first
    }
}

/// The workload's own `rekindle.io/reload-window` annotation, as written.
pub fn own_window(workload: &serde_json::Value) -> Option<&str> {
    workload
        .pointer("/metadata/annotations")?
        .get(RELOAD_WINDOW_ANNOTATION)?
        .as_str()
}

/// The window a workload's reloads wait for: its own annotation (`own`), else its namespace's (`namespace`,
/// the annotation's value on the Namespace), else `default` (`--reload-window`). An invalid value is
/// an error for the caller to report; the workload then has no window, so a typo never stops its
/// reloads.
pub fn window_of(
    own: Option<&str>,
    namespace: Option<&str>,
    default: Option<&Windows>,
) -> Result<Option<Windows>, WindowError> {
    let (text, whose) = match (own, namespace) {
        (Some(text), _) => (text, "annotation"),
        (None, Some(text)) => (text, "the namespace's annotation"),
        (None, None) => return Ok(default.cloned()),
    };
    text.parse().map(Some).map_err(|e: WindowError| {
        WindowError(format!(
            "invalid reload window {text:?} in {whose} {RELOAD_WINDOW_ANNOTATION}, ignored: {}",
            e.0
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn w(s: &str) -> Windows {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn open_inside_closed_outside_with_the_next_opening() {
        // 2026-12-02 is a Wednesday.
        let office = w("Mon-Fri 09:00-17:00");
        assert_eq!(office.opens_at(at("2026-12-02T10:00:00Z")), None);
        assert_eq!(
            office.opens_at(at("2026-12-02T09:00:00Z")),
            None,
            "start is in"
        );
        assert_eq!(
            office.opens_at(at("2026-12-02T17:00:00Z")),
            Some(at("2026-12-03T09:00:00Z")),
            "end is out"
        );
        // Friday evening: next Monday.
        assert_eq!(
            office.opens_at(at("2026-12-04T18:00:00Z")),
            Some(at("2026-12-07T09:00:00Z"))
        );
    }

    #[test]
    fn a_window_crossing_midnight_belongs_to_the_day_it_opens() {
        let night = w("Fri 22:00-02:00");
        assert_eq!(night.opens_at(at("2026-12-04T23:00:00Z")), None);
        assert_eq!(
            night.opens_at(at("2026-12-05T01:59:00Z")),
            None,
            "Saturday small hours"
        );
        assert_eq!(
            night.opens_at(at("2026-12-05T02:00:00Z")),
            Some(at("2026-12-11T22:00:00Z"))
        );
        assert_eq!(
            night.opens_at(at("2026-12-04T01:00:00Z")),
            Some(at("2026-12-04T22:00:00Z")),
            "Friday small hours belong to Thursday, which has no window"
        );
    }

    #[test]
    fn zones_days_and_several_windows() {
        // 09:00 in Berlin is 08:00 UTC in winter.
        let berlin = w("* 09:00-10:00 Europe/Berlin");
        assert_eq!(berlin.opens_at(at("2026-12-02T08:30:00Z")), None);
        assert_eq!(
            berlin.opens_at(at("2026-12-02T07:00:00Z")),
            Some(at("2026-12-02T08:00:00Z"))
        );
        let weekend_or_nights = w("Sat,Sun 00:00-23:59; Mon-Fri 20:00-06:00");
        assert_eq!(weekend_or_nights.opens_at(at("2026-12-05T12:00:00Z")), None);
        assert_eq!(weekend_or_nights.opens_at(at("2026-12-02T05:00:00Z")), None);
        assert_eq!(
            weekend_or_nights.opens_at(at("2026-12-02T12:00:00Z")),
            Some(at("2026-12-02T20:00:00Z"))
        );
        let wrapping = w("Fri-Mon 12:00-13:00");
        assert_eq!(
            wrapping.opens_at(at("2026-12-01T14:00:00Z")),
            Some(at("2026-12-04T12:00:00Z")),
            "Tuesday: next Friday"
        );
        assert_eq!(
            wrapping.opens_at(at("2026-12-07T12:30:00Z")),
            None,
            "Monday"
        );
        assert_eq!(
            w("monday 09:00-10:00").to_string(),
            "monday 09:00-10:00",
            "full day names, kept as written"
        );
    }

    #[test]
    fn a_start_skipped_by_daylight_saving_opens_after_the_jump() {
        // Berlin skips 02:00-03:00 on 2027-03-28.
        let w = w("Sun 02:30-04:00 Europe/Berlin");
        assert_eq!(
            w.opens_at(at("2027-03-27T12:00:00Z")),
            Some(at("2027-03-28T01:30:00Z"))
        );
    }

    #[test]
    fn the_workloads_window_wins_then_its_namespaces_then_the_default() {
        let default = w("Sat 00:00-06:00");
        let own = serde_json::json!({"metadata": {"annotations": {RELOAD_WINDOW_ANNOTATION: "Mon 01:00-02:00"}}});
        let namespace = Some("Tue 01:00-02:00");
        assert_eq!(
            window_of(own_window(&own), namespace, Some(&default)).unwrap(),
            Some(w("Mon 01:00-02:00"))
        );
        assert_eq!(
            window_of(None, namespace, Some(&default)).unwrap(),
            Some(w("Tue 01:00-02:00"))
        );
        assert_eq!(
            window_of(None, None, Some(&default)).unwrap(),
            Some(default.clone())
        );
        assert_eq!(
            window_of(own_window(&serde_json::json!({})), None, None).unwrap(),
            None
        );
        let err = window_of(Some("Mon 1-2"), namespace, Some(&default))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("in annotation rekindle.io/reload-window"),
            "{err}"
        );
        let err = window_of(None, Some("Mon 1-2"), Some(&default))
            .unwrap_err()
            .to_string();
        assert!(err.contains("the namespace's annotation"), "{err}");
    }

    #[test]
    fn invalid_values_say_what_is_wrong() {
        for (value, says) in [
            ("", "no window"),
            ("Mon-Fri", "expected DAYS HH:MM-HH:MM"),
            ("Mon-Fri 9-17", "not a time of day"),
            ("Mon-Fri 09:00", "not a time span"),
            ("Mon-Fri 25:00-26:00", "not a time of day"),
            ("Mon-Fri 09:00-09:00", "empty"),
            ("Someday 09:00-10:00", "not a day"),
            ("* 09:00-10:00 Mars/Olympus", "not a known IANA time zone"),
            ("* 09:00-10:00 UTC extra", "expected DAYS"),
        ] {
            let err = value.parse::<Windows>().unwrap_err().to_string();
            assert!(err.contains(says), "{value:?}: {err}");
        }
    }
}
