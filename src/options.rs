//! Keyed options from Python dicts (`format_options={...}`, `storage_options={...}`):
//! each reader takes the keys it knows, and any key left over is an error rather than
//! silently ignored.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Options(pub BTreeMap<String, OptionValue>);

impl Options {
    /// Starts reading the options for `what` (a format's name, "storage").
    pub fn reader<'a>(&'a self, format: &'static str) -> OptionReader<'a> {
        OptionReader {
            options: self,
            format,
            used: BTreeSet::new(),
            known: Vec::new(),
        }
    }
}

pub struct OptionReader<'a> {
    options: &'a Options,
    format: &'static str,
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
        Error::invalid_argument(format!(
            "format_options[{key:?}] for {} must be {expected}",
            self.format
        ))
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

    /// A number of seconds (int or float given as a string or int).
    pub fn seconds(&mut self, key: &'static str, default: f64) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(OptionValue::Int(i)) if *i >= 0 => Ok(*i as f64),
            Some(OptionValue::Float(f)) if *f >= 0.0 => Ok(*f),
            Some(_) => Err(self.wrong(key, "a non-negative number of seconds")),
        }
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
            Ok(())
        } else {
            Err(Error::invalid_argument(format!(
                "{} has no format option {unknown:?}; it understands {:?}",
                self.format, self.known
            )))
        }
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
}
