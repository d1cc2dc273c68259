//! Label selectors in Reloader's legacy flag syntax (`k:v` = `k=v`; `k:*` and `k=*` = key exists),
//! plus the usual Kubernetes forms (`k!=v`, `!k`, `k in (a,b)`, `k notin (a,b)`). Entries are ANDed.
//! Parsed at start-up so a bad selector is a start-up error, and rendered for server-side filtering.

use std::collections::BTreeMap;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector(pub Vec<Requirement>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid selector {entry:?}: {why}")]
pub struct SelectorError {
    pub entry: String,
    pub why: String,
}

fn valid_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err(format!("key prefix {p:?} is not a DNS subdomain"));
        }
    }
    valid_name(name).map_err(|w| format!("key {key:?} {w}"))
}

fn valid_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 63 {
        return Err("must be 1 to 63 characters".into());
    }
    valid_value(name)
}

fn valid_value(v: &str) -> Result<(), String> {
    if v.len() > 63 {
        return Err(format!("value {v:?} is longer than 63 characters"));
    }
    let ok_char = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.';
    let alnum = |b: Option<u8>| b.is_none_or(|b| b.is_ascii_alphanumeric());
    if !v.bytes().all(ok_char) || !alnum(v.bytes().next()) || !alnum(v.bytes().last()) {
        return Err(format!(
            "value {v:?} must be alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
        ));
    }
    Ok(())
}

fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_set(s: &str) -> Option<Vec<String>> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_string()).collect())
}

impl Selector {
    /// Parses the entries of a list flag (already split), each one requirement in legacy or native syntax.
    pub fn parse_legacy<S: AsRef<str>>(entries: &[S]) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        // A quoted list value (`--namespace-selector="a:b,c:*"`, as Reloader's chart writes it) arrives as
        // one entry: split it again on commas outside parentheses.
        for entry in entries.iter().flat_map(|e| split_top_level(e.as_ref())) {
            let raw = entry.trim();
            if raw.is_empty() {
                continue;
            }
            let err = |why: String| SelectorError {
                entry: raw.to_string(),
                why,
            };
            let req = Self::parse_one(raw).map_err(err)?;
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    fn parse_one(raw: &str) -> Result<Requirement, String> {
        if let Some(key) = raw.strip_prefix('!') {
            let key = key.trim();
            valid_key(key)?;
            return Ok(Requirement::NotExists(key.into()));
        }
        for (word, notin) in [(" notin ", true), (" in ", false)] {
            if let Some((key, set)) = raw.split_once(word) {
                let key = key.trim();
                valid_key(key)?;
                let values = parse_set(set)
                    .ok_or_else(|| format!("expected ({{values}}) after {}", word.trim()))?;
                for v in &values {
                    valid_value(v)?;
                }
                return Ok(if notin {
                    Requirement::NotIn(key.into(), values)
                } else {
                    Requirement::In(key.into(), values)
                });
            }
        }
        if let Some((key, value)) = raw.split_once("!=") {
            let (key, value) = (key.trim(), value.trim());
            valid_key(key)?;
            valid_value(value)?;
            return Ok(Requirement::NotEquals(key.into(), value.into()));
        }
        // Legacy `k:v`; Reloader replaces the colon with `=`.
        let normalized = raw.replacen(':', "=", 1);
        if let Some((key, value)) = normalized.split_once('=') {
            let key = key.trim();
            let value = value.strip_prefix('=').unwrap_or(value).trim();
            valid_key(key)?;
            if value == "*" {
                return Ok(Requirement::Exists(key.into()));
            }
            valid_value(value)?;
            return Ok(Requirement::Equals(key.into(), value.into()));
        }
        valid_key(raw)?;
        Ok(Requirement::Exists(raw.into()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
        })
    }
}

impl fmt::Display for Selector {
    /// The server-side `labelSelector` query form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|r| match r {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::NotEquals(k, v) => format!("{k}!={v}"),
                Requirement::Exists(k) => k.clone(),
                Requirement::NotExists(k) => format!("!{k}"),
                Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn legacy_syntax() {
        let s = Selector::parse_legacy(&[
            "team:a",
            "env=*",
            "tier:*",
            "x!=y",
            "!gone",
            "app in (a, b)",
        ])
        .unwrap();
        assert_eq!(s.to_string(), "team=a,env,tier,x!=y,!gone,app in (a,b)");
        assert!(s.matches(&labels(&[
            ("team", "a"),
            ("env", "p"),
            ("tier", ""),
            ("app", "b")
        ])));
        assert!(!s.matches(&labels(&[
            ("team", "b"),
            ("env", "p"),
            ("tier", ""),
            ("app", "b")
        ])));
        assert!(!s.matches(&labels(&[("team", "a"), ("tier", ""), ("app", "b")])));
        assert!(!s.matches(&labels(&[
            ("team", "a"),
            ("env", "p"),
            ("tier", ""),
            ("app", "b"),
            ("gone", "1")
        ])));
    }

    #[test]
    fn double_equals_and_prefixes() {
        let s = Selector::parse_legacy(&["example.com/team==a"]).unwrap();
        assert_eq!(
            s.0,
            vec![Requirement::Equals("example.com/team".into(), "a".into())]
        );
    }

    #[test]
    fn invalid() {
        for bad in [
            "=a",
            "a b=c",
            "k=v v",
            "Bad_Prefix/x=y",
            "k in a,b",
            "k=-x-",
        ] {
            assert!(
                Selector::parse_legacy(&[bad]).is_err(),
                "{bad} should be refused"
            );
        }
    }
}
