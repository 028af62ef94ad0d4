//! Lenient versions and version ranges, for the VERSION operator, ordering operators on version
//! strings, and capability refs. Agents report versions as tools print them (`2.34.1`, `20`,
//! `1.95.0-nightly`, `v18.2`, `3.12.0rc1`), so parsing is lenient: an optional `v`, one to three
//! numeric components (missing ones are 0, further numeric ones are ignored), and an optional
//! pre-release after `-` or directly after the digits. Ordering is SemVer 2.0 ordering (a
//! pre-release sorts before its release) via the `semver` crate; build metadata is dropped.
//!
//! A range is one or more alternatives separated by `||`; an alternative is comparators separated
//! by commas and/or spaces, all of which must hold. A comparator is an optional operator (`=`,
//! `>`, `>=`, `<`, `<=`, `^`, `~`) followed by a partial version whose missing or wildcard (`x`,
//! `X`, `*`) components widen it: `20` and `20.x` mean `>=20.0.0, <21.0.0-0`; `^1.2` means
//! `>=1.2.0, <2.0.0-0`; `^0.2.3` means `>=0.2.3, <0.3.0-0`; `~1.2.3` means `>=1.2.3, <1.3.0-0`;
//! `>2.30` means `>=2.31.0-0`; `<=2.30` means `<2.31.0-0`; `*` matches every version.
//! Pre-releases are ordinary versions in this ordering: `1.95.0-nightly` satisfies `>=1.90`.

use semver::{BuildMetadata, Prerelease, Version};
use std::cmp::Ordering;
use std::fmt;

/// Parses a version leniently; `None` when no leading number can be read.
pub fn parse_lenient(text: &str) -> Option<Version> {
    let t = text.trim();
    let t = t
        .strip_prefix('v')
        .or_else(|| t.strip_prefix('V'))
        .unwrap_or(t);
    let mut nums = [0u64; 3];
    let mut count = 0usize;
    let mut rest = t;
    let mut pre = "";
    loop {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            if count == 0 {
                return None;
            }
            break;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        if count < 3 {
            nums[count] = n;
        }
        count += 1;
        rest = &rest[digits..];
        match rest.as_bytes().first() {
            Some(b'.') if rest.as_bytes().get(1).is_some_and(u8::is_ascii_digit) => {
                rest = &rest[1..];
            }
            Some(b'-') => {
                pre = &rest[1..];
                break;
            }
            Some(b'+') | None => break,
            Some(_) => {
                pre = rest.trim_start_matches('.');
                break;
            }
        }
    }
    let pre = pre.split('+').next().unwrap_or("");
    let mut v = Version::new(nums[0], nums[1], nums[2]);
    v.pre = sanitize_pre(pre);
    v.build = BuildMetadata::EMPTY;
    Some(v)
}

/// Turns free text into a valid SemVer pre-release (identifiers of `[0-9A-Za-z-]`, numeric ones
/// without leading zeros), or empty.
fn sanitize_pre(pre: &str) -> Prerelease {
    if pre.is_empty() {
        return Prerelease::EMPTY;
    }
    if let Ok(p) = Prerelease::new(pre) {
        return p;
    }
    let cleaned: Vec<String> = pre
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '-')
        .filter(|s| !s.is_empty())
        .map(|s| {
            if s.bytes().all(|b| b.is_ascii_digit()) {
                let trimmed = s.trim_start_matches('0');
                if trimmed.is_empty() {
                    "0".to_owned()
                } else {
                    trimmed.to_owned()
                }
            } else {
                s.to_owned()
            }
        })
        .collect();
    Prerelease::new(&cleaned.join(".")).unwrap_or(Prerelease::EMPTY)
}

/// Reads a JSON value as a version: strings leniently, non-negative numbers by their text
/// (`20` → `20.0.0`, `3.12` → `3.12.0`).
pub fn from_json(value: &serde_json::Value) -> Option<Version> {
    match value {
        serde_json::Value::String(s) => parse_lenient(s),
        serde_json::Value::Number(n) => parse_lenient(&n.to_string()),
        _ => None,
    }
}

/// Why a range did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid version range `{range}`: {reason}")]
pub struct RangeError {
    /// The range text.
    pub range: String,
    /// What was wrong.
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Bound {
    version: Version,
    inclusive: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Interval {
    lower: Option<Bound>,
    upper: Option<Bound>,
}

impl Interval {
    fn contains(&self, v: &Version) -> bool {
        let lower_ok = self.lower.as_ref().is_none_or(|b| match v.cmp(&b.version) {
            Ordering::Greater => true,
            Ordering::Equal => b.inclusive,
            Ordering::Less => false,
        });
        let upper_ok = self.upper.as_ref().is_none_or(|b| match v.cmp(&b.version) {
            Ordering::Less => true,
            Ordering::Equal => b.inclusive,
            Ordering::Greater => false,
        });
        lower_ok && upper_ok
    }
}

/// A compiled version range (see the module doc for the syntax).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionRange {
    text: String,
    /// Alternatives; each is a conjunction of intervals.
    alternatives: Vec<Vec<Interval>>,
}

impl fmt::Display for VersionRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn floor(v: [u64; 3]) -> Version {
    Version::new(v[0], v[1], v[2])
}

/// The lowest version of `v`: `v-0`.
fn lowest(v: Version) -> Version {
    let mut v = v;
    v.pre = Prerelease::new("0").unwrap_or(Prerelease::EMPTY);
    v
}

/// The version just past the given prefix of `n` components (`[1,2,_]`, 2 → `1.3.0-0`).
fn next_after(nums: [u64; 3], given: usize) -> Version {
    let v = match given {
        0 => return lowest(Version::new(u64::MAX, 0, 0)),
        1 => Version::new(nums[0].saturating_add(1), 0, 0),
        2 => Version::new(nums[0], nums[1].saturating_add(1), 0),
        _ => Version::new(nums[0], nums[1], nums[2].saturating_add(1)),
    };
    lowest(v)
}

impl VersionRange {
    /// Parses a range.
    pub fn parse(text: &str) -> Result<Self, RangeError> {
        let err = |reason: String| RangeError {
            range: text.to_owned(),
            reason,
        };
        if text.trim().is_empty() {
            return Err(err("empty range".into()));
        }
        let mut alternatives = Vec::new();
        for alt in text.split("||") {
            let mut intervals = Vec::new();
            for raw in alt.split([',', ' ', '\t']).filter(|s| !s.is_empty()) {
                intervals.push(parse_comparator(raw).map_err(&err)?);
            }
            if intervals.is_empty() {
                return Err(err("empty alternative".into()));
            }
            alternatives.push(intervals);
        }
        Ok(Self {
            text: text.trim().to_owned(),
            alternatives,
        })
    }

    /// Whether `version` is in the range.
    pub fn matches(&self, version: &Version) -> bool {
        self.alternatives
            .iter()
            .any(|alt| alt.iter().all(|i| i.contains(version)))
    }

    /// The range text as given (trimmed).
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

fn parse_comparator(raw: &str) -> Result<Interval, String> {
    let (op, rest) = ["<=", ">=", "=", "<", ">", "^", "~"]
        .iter()
        .find_map(|op| raw.strip_prefix(op).map(|r| (*op, r)))
        .unwrap_or(("", raw));
    let rest = rest.trim();
    let rest = rest
        .strip_prefix('v')
        .or_else(|| rest.strip_prefix('V'))
        .unwrap_or(rest);
    if rest.is_empty() {
        return Err(format!("`{raw}` has no version"));
    }
    // Split off a pre-release on the last component.
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, p),
        None => (rest, ""),
    };
    let core = core.split('+').next().unwrap_or(core);
    let mut nums = [0u64; 3];
    let mut given = 0usize;
    let mut wildcard = false;
    for (i, part) in core.split('.').enumerate() {
        if i >= 3 {
            return Err(format!("`{raw}` has more than three components"));
        }
        if matches!(part, "x" | "X" | "*") {
            wildcard = true;
            continue;
        }
        if wildcard {
            return Err(format!("`{raw}` has a number after a wildcard"));
        }
        nums[i] = part
            .parse()
            .map_err(|_| format!("`{part}` in `{raw}` is not a number"))?;
        given = i + 1;
    }
    let exact = {
        let mut v = floor(nums);
        v.pre = sanitize_pre(pre);
        v
    };
    let lower_incl = |v: Version| {
        Some(Bound {
            version: v,
            inclusive: true,
        })
    };
    let upper_excl = |v: Version| {
        Some(Bound {
            version: v,
            inclusive: false,
        })
    };
    Ok(match op {
        "" | "=" => {
            if given == 3 {
                Interval {
                    lower: lower_incl(exact.clone()),
                    upper: Some(Bound {
                        version: exact,
                        inclusive: true,
                    }),
                }
            } else {
                Interval {
                    lower: if given == 0 {
                        None
                    } else {
                        lower_incl(lowest(floor(nums)))
                    },
                    upper: if given == 0 {
                        None
                    } else {
                        upper_excl(next_after(nums, given))
                    },
                }
            }
        }
        ">=" => Interval {
            lower: if given == 0 {
                None
            } else {
                lower_incl(if given == 3 {
                    exact
                } else {
                    lowest(floor(nums))
                })
            },
            upper: None,
        },
        ">" => {
            if given == 3 {
                Interval {
                    lower: Some(Bound {
                        version: exact,
                        inclusive: false,
                    }),
                    upper: None,
                }
            } else if given == 0 {
                Interval {
                    lower: lower_incl(next_after(nums, 0)),
                    upper: None,
                }
            } else {
                Interval {
                    lower: lower_incl(next_after(nums, given)),
                    upper: None,
                }
            }
        }
        "<" => Interval {
            lower: None,
            upper: upper_excl(if given == 3 {
                exact
            } else {
                lowest(floor(nums))
            }),
        },
        "<=" => Interval {
            lower: None,
            upper: if given == 3 {
                Some(Bound {
                    version: exact,
                    inclusive: true,
                })
            } else if given == 0 {
                None
            } else {
                upper_excl(next_after(nums, given))
            },
        },
        "^" => {
            // The first non-zero given component may not change.
            let upper_given = if nums[0] > 0 || given <= 1 {
                1
            } else if nums[1] > 0 || given == 2 {
                2
            } else {
                3
            };
            Interval {
                lower: if given == 0 {
                    None
                } else {
                    lower_incl(if given == 3 {
                        exact
                    } else {
                        lowest(floor(nums))
                    })
                },
                upper: if given == 0 {
                    None
                } else {
                    upper_excl(next_after(nums, upper_given.min(given)))
                },
            }
        }
        _ => {
            // "~": patch-level changes if a minor is given, else minor-level.
            Interval {
                lower: if given == 0 {
                    None
                } else {
                    lower_incl(if given == 3 {
                        exact
                    } else {
                        lowest(floor(nums))
                    })
                },
                upper: if given == 0 {
                    None
                } else {
                    upper_excl(next_after(nums, given.clamp(1, 2)))
                },
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        parse_lenient(s).unwrap()
    }

    fn m(range: &str, version: &str) -> bool {
        VersionRange::parse(range).unwrap().matches(&v(version))
    }

    #[test]
    fn lenient_parsing() {
        assert_eq!(v("2.34.1"), Version::new(2, 34, 1));
        assert_eq!(v("20"), Version::new(20, 0, 0));
        assert_eq!(v("v18.2"), Version::new(18, 2, 0));
        assert_eq!(v("1.95.0-nightly").pre.as_str(), "nightly");
        assert_eq!(v("3.12.0rc1").pre.as_str(), "rc1");
        assert_eq!(v("1.2.3.4"), Version::new(1, 2, 3));
        assert_eq!(v("2.34.1.windows.1"), {
            let mut x = Version::new(2, 34, 1);
            x.pre = Prerelease::new("windows.1").unwrap();
            x
        });
        assert_eq!(v("1.0.0+build.5"), Version::new(1, 0, 0));
        assert_eq!(v("1.0.0-rc.01").pre.as_str(), "rc.1");
        assert!(parse_lenient("abc").is_none());
        assert!(parse_lenient("").is_none());
        assert!(parse_lenient("v").is_none());
    }

    #[test]
    fn json_numbers_read_as_versions() {
        assert_eq!(
            from_json(&serde_json::json!(20)),
            Some(Version::new(20, 0, 0))
        );
        assert_eq!(
            from_json(&serde_json::json!(3.12)),
            Some(Version::new(3, 12, 0))
        );
        assert_eq!(from_json(&serde_json::json!(true)), None);
    }

    #[test]
    fn prerelease_orders_before_release() {
        assert!(v("1.95.0-nightly") < v("1.95.0"));
        assert!(v("1.95.0-nightly") > v("1.94.9"));
    }

    #[test]
    fn caret() {
        assert!(m("^20", "20.11.1"));
        assert!(!m("^20", "18.19.0"));
        assert!(!m("^20", "21.0.0"));
        assert!(!m("^20", "21.0.0-rc.1"));
        assert!(m("^1.2", "1.9.0"));
        assert!(!m("^1.2", "1.1.9"));
        assert!(m("^0.2.3", "0.2.9"));
        assert!(!m("^0.2.3", "0.3.0"));
        assert!(m("^0.0.3", "0.0.3"));
        assert!(!m("^0.0.3", "0.0.4"));
        assert!(m("^0", "0.9.0"));
        assert!(!m("^0", "1.0.0"));
    }

    #[test]
    fn tilde() {
        assert!(m("~1.2.3", "1.2.9"));
        assert!(!m("~1.2.3", "1.3.0"));
        assert!(m("~1.2", "1.2.0"));
        assert!(m("~1", "1.9.0"));
        assert!(!m("~1", "2.0.0"));
    }

    #[test]
    fn bare_and_wildcards() {
        assert!(m("20", "20.3.1"));
        assert!(m("20.x", "20.3.1"));
        assert!(m("20.*", "20.0.0"));
        assert!(!m("20.x", "21.0.0"));
        assert!(m("=1.2.3", "1.2.3"));
        assert!(!m("=1.2.3", "1.2.4"));
        assert!(m("1.2", "1.2.7"));
        assert!(m("*", "0.0.1"));
        assert!(m("x", "99.0.0"));
    }

    #[test]
    fn comparators_and_conjunctions() {
        assert!(m(">=2.30, <3", "2.34.1"));
        assert!(!m(">=2.30, <3", "2.25.0"));
        assert!(!m(">=2.30, <3", "3.0.0"));
        assert!(!m(">=2.30 <3", "3.0.0-rc1"));
        assert!(m(">2.30", "2.31.0"));
        assert!(!m(">2.30", "2.30.9"));
        assert!(m(">2.30.1", "2.30.2"));
        assert!(m("<=2.30", "2.30.9"));
        assert!(!m("<=2.30", "2.31.0"));
        assert!(m("<=2.30.1", "2.30.1"));
        assert!(m("<2.30.1", "2.30.1-beta"));
        assert!(m(">=1.90", "1.95.0-nightly"));
        assert!(m("^18 || ^20", "20.1.0"));
        assert!(!m("^18 || ^20", "19.1.0"));
        assert!(m(">=v18.2", "18.2.0"));
    }

    #[test]
    fn bad_ranges() {
        for r in ["", "  ", ">=", "^a", "1.2.3.4", "1.2.3 ||", ">=1.x.foo"] {
            assert!(VersionRange::parse(r).is_err(), "{r:?} should not parse");
        }
    }
}
