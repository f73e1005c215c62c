//! Keyed options from Python dicts (`format_options={...}`, `storage_options={...}`):
//! each reader takes the keys it knows, and any key left over is an error rather than
//! silently ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::error::{Error, Result};

/// A value of a format or storage option.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// `True` / `False`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A number with a fraction.
    Float(f64),
    /// Text.
    Str(String),
    /// A list (e.g. an image size `[224, 224]`).
    List(Vec<OptionValue>),
    /// A dict (e.g. `{"jpg": "rgb8"}`).
    Map(BTreeMap<String, OptionValue>),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Options(pub BTreeMap<String, OptionValue>);

/// The longest wait an option may set: a week, far beyond any useful timeout, and far
/// enough inside `Duration`'s range that arithmetic on it cannot overflow.
const MAX_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

impl Options {
    /// Starts reading `format_options` for a format (its name, for messages).
    pub fn reader<'a>(&'a self, format: &'static str) -> OptionReader<'a> {
        OptionReader {
            options: self,
            format: Some(format),
            used: BTreeSet::new(),
            known: Vec::new(),
        }
    }

    /// Options kept as JSON (a write manifest's `format_options`).
    pub fn from_json(map: &serde_json::Map<String, serde_json::Value>) -> Result<Self> {
        fn value(key: &str, json: &serde_json::Value) -> Result<OptionValue> {
            use serde_json::Value;
            Ok(match json {
                Value::Bool(b) => OptionValue::Bool(*b),
                Value::String(s) => OptionValue::Str(s.clone()),
                Value::Number(n) => match n.as_i64() {
                    Some(i) => OptionValue::Int(i),
                    None => OptionValue::Float(n.as_f64().unwrap_or(f64::NAN)),
                },
                Value::Array(items) => {
                    OptionValue::List(items.iter().map(|v| value(key, v)).collect::<Result<_>>()?)
                }
                Value::Object(map) => OptionValue::Map(Options::from_json(map)?.0),
                Value::Null => {
                    return Err(Error::invalid_argument(format!("option {key:?} is null")));
                }
            })
        }
        map.iter()
            .map(|(key, v)| Ok((key.clone(), value(key, v)?)))
            .collect::<Result<_>>()
            .map(Options)
    }

    /// Starts reading `storage_options`.
    pub fn storage_reader(&self) -> OptionReader<'_> {
        OptionReader {
            options: self,
            format: None,
            used: BTreeSet::new(),
            known: Vec::new(),
        }
    }
}

pub struct OptionReader<'a> {
    options: &'a Options,
    /// The format whose `format_options` these are; `None` for `storage_options`.
    format: Option<&'static str>,
    used: BTreeSet<&'a str>,
    /// Every key asked for, for the error message.
    known: Vec<&'static str>,
}

impl<'a> OptionReader<'a> {
    fn get(&mut self, key: &'static str) -> Option<&'a OptionValue> {
        self.known.push(key);
        let (name, value) = self.options.0.get_key_value(key)?;
        self.used.insert(name.as_str());
        Some(value)
    }

    fn wrong(&self, key: &str, expected: &str) -> Error {
        let option = match self.format {
            Some(format) => format!("format_options[{key:?}] for {format}"),
            None => format!("storage_options[{key:?}]"),
        };
        Error::invalid_argument(format!("{option} must be {expected}"))
    }

    pub fn bool(&mut self, key: &'static str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(OptionValue::Bool(b)) => Ok(*b),
            Some(_) => Err(self.wrong(key, "True or False")),
        }
    }

    pub fn u64(&mut self, key: &'static str, default: u64) -> Result<u64> {
        match self.get(key) {
            None => Ok(default),
            Some(OptionValue::Int(i)) if *i >= 0 => Ok(*i as u64),
            Some(_) => Err(self.wrong(key, "a non-negative integer")),
        }
    }

    /// Any string.
    pub fn string(&mut self, key: &'static str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(OptionValue::Str(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(self.wrong(key, "a string")),
        }
    }

    /// A list of strings (or one string).
    pub fn strings(&mut self, key: &'static str) -> Result<Option<Vec<String>>> {
        let list = |items: &[OptionValue]| {
            items
                .iter()
                .map(|v| match v {
                    OptionValue::Str(s) => Some(s.clone()),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
        };
        match self.get(key) {
            None => Ok(None),
            Some(OptionValue::Str(s)) => Ok(Some(vec![s.clone()])),
            Some(OptionValue::List(items)) => match list(items) {
                Some(strings) => Ok(Some(strings)),
                None => Err(self.wrong(key, "a list of strings")),
            },
            Some(_) => Err(self.wrong(key, "a list of strings")),
        }
    }

    /// A number of seconds (int or float), from 0 to a week.
    pub fn seconds(&mut self, key: &'static str, default: Duration) -> Result<Duration> {
        let seconds = match self.get(key) {
            None => return Ok(default),
            Some(OptionValue::Int(i)) => *i as f64,
            Some(OptionValue::Float(f)) => *f,
            Some(_) => return Err(self.wrong(key, "a number of seconds")),
        };
        // NaN fails the range test too.
        if !(0.0..=MAX_SECONDS).contains(&seconds) {
            return Err(self.wrong(
                key,
                &format!("a number of seconds from 0 to {MAX_SECONDS}, not {seconds}"),
            ));
        }
        Duration::try_from_secs_f64(seconds)
            .map_err(|e| self.wrong(key, &format!("a number of seconds ({e})")))
    }

    /// A string option restricted to `choices`.
    pub fn choice(
        &mut self,
        key: &'static str,
        default: &'static str,
        choices: &[&'static str],
    ) -> Result<&'a str> {
        match self.get(key) {
            None => Ok(default),
            Some(OptionValue::Str(s)) if choices.contains(&s.as_str()) => Ok(s.as_str()),
            Some(_) => Err(self.wrong(key, &format!("one of {choices:?}"))),
        }
    }

    /// Fails on keys no reader asked for.
    pub fn finish(self) -> Result<()> {
        let unknown: Vec<&str> = self
            .options
            .0
            .keys()
            .map(String::as_str)
            .filter(|k| !self.used.contains(k))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        let owner = match self.format {
            Some(format) => format!("{format} has no format option"),
            None => "storage_options has no option".to_string(),
        };
        Err(Error::invalid_argument(format!(
            "{owner} {unknown:?}; it understands {:?}",
            self.known
        )))
    }
}

/// As the user wrote it in Python: `"rows"`, `3`, `True`, `[224, 224]`, `{"jpg": "rgb8"}`.
impl std::fmt::Display for OptionValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let joined = |items: Vec<String>| items.join(", ");
        match self {
            OptionValue::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            OptionValue::Int(n) => write!(f, "{n}"),
            OptionValue::Float(x) => write!(f, "{x}"),
            OptionValue::Str(s) => write!(f, "{s:?}"),
            OptionValue::List(items) => {
                write!(
                    f,
                    "[{}]",
                    joined(items.iter().map(|v| v.to_string()).collect())
                )
            }
            OptionValue::Map(map) => write!(
                f,
                "{{{}}}",
                joined(map.iter().map(|(k, v)| format!("{k:?}: {v}")).collect())
            ),
        }
    }
}

impl From<bool> for OptionValue {
    fn from(value: bool) -> Self {
        OptionValue::Bool(value)
    }
}

impl From<i64> for OptionValue {
    fn from(value: i64) -> Self {
        OptionValue::Int(value)
    }
}

impl From<f64> for OptionValue {
    fn from(value: f64) -> Self {
        OptionValue::Float(value)
    }
}

impl From<&str> for OptionValue {
    fn from(value: &str) -> Self {
        OptionValue::Str(value.to_string())
    }
}

impl From<String> for OptionValue {
    fn from(value: String) -> Self {
        OptionValue::Str(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_mistyped_options_are_errors() {
        let mut map = BTreeMap::new();
        map.insert("verify_crc".to_string(), OptionValue::Bool(false));
        map.insert("typo".to_string(), OptionValue::Int(1));
        let options = Options(map);
        let mut reader = options.reader("tfrecord");
        assert!(!reader.bool("verify_crc", true).unwrap());
        assert_eq!(reader.u64("limit", 5).unwrap(), 5);
        assert!(reader.finish().unwrap_err().to_string().contains("typo"));
        let mut reader = options.reader("tfrecord");
        assert!(reader.u64("verify_crc", 1).is_err());
    }

    #[test]
    fn seconds_out_of_range_are_errors_naming_the_dictionary() {
        for bad in [f64::INFINITY, 1e300, f64::NAN, -1.0, 1e18] {
            let options = Options(BTreeMap::from([(
                "timeout_seconds".to_string(),
                OptionValue::Float(bad),
            )]));
            let err = options
                .storage_reader()
                .seconds("timeout_seconds", Duration::ZERO)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("storage_options[\"timeout_seconds\"] must be"),
                "{err}"
            );
        }
        let options = Options(BTreeMap::from([(
            "t".to_string(),
            OptionValue::Float(0.25),
        )]));
        let mut reader = options.storage_reader();
        assert_eq!(
            reader.seconds("t", Duration::ZERO).unwrap(),
            Duration::from_millis(250)
        );
        let err = Options(BTreeMap::from([("x".to_string(), OptionValue::Int(1))]))
            .storage_reader()
            .finish()
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("storage_options has no option"), "{err}");
    }
}
