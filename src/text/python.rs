//! Values written as Python writes them, for templates written against Jinja2 (which
//! prints with `str()`) and transformers' `tojson` (which is `json.dumps`): `None`,
//! `True`, `['a', 1]`, `1e-05`, and JSON with Python's separators and escapes.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Whether Python's `str.isspace()` holds for `c` (what `strip()` and `split()` remove):
/// Unicode's white space and the four information separators U+001C..U+001F.
pub fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `str(value)`.
pub fn str_of(value: &Value, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        _ => repr(value, out)?,
    }
    Ok(())
}

/// `repr(value)`: how Python prints a value inside a list or dict.
pub fn repr(value: &Value, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => number(value, out)?,
        ValueKind::String => string_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(&item, out)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(&key, out)?;
                out.push_str(": ");
                repr(&value.get_item(&key)?, out)?;
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

/// A number as Python prints it: integers in full, floats as `repr(float)` does.
fn number(value: &Value, out: &mut String) -> Result<(), Error> {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return Ok(());
    }
    let x = f64::try_from(value.clone())?;
    float(x, out);
    Ok(())
}

/// `repr(x)` of a float: the shortest digits that read back as `x`, in positional form
/// for decimal exponents -4..16 (with `.0` when whole) and as `1.5e-05` beyond.
pub fn float(x: f64, out: &mut String) {
    if x.is_nan() {
        out.push_str("nan");
        return;
    }
    if x.is_infinite() {
        out.push_str(if x > 0.0 { "inf" } else { "-inf" });
        return;
    }
    // Rust's `{:e}` is the shortest round-trip form: "-1.5e-5".
    let sci = format!("{x:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    out.push_str(sign);
    if (-4..16).contains(&exponent) {
        let point = exponent + 1;
        if point <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-point) as usize));
            out.push_str(&digits);
        } else if point as usize >= digits.len() {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', point as usize - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..point as usize]);
            out.push('.');
            out.push_str(&digits[point as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{:02}",
            if exponent < 0 { '-' } else { '+' },
            exponent.abs()
        );
    }
}

/// `repr(s)`: single quotes unless the text holds one and no double quote.
fn string_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !printable(c) => {
                let code = c as u32;
                let _ = match code {
                    0..=0xff => write!(out, "\\x{code:02x}"),
                    0x100..=0xffff => write!(out, "\\u{code:04x}"),
                    _ => write!(out, "\\U{code:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// `str.isprintable()` for one character, for the characters text holds in practice:
/// controls, separators other than the space, and the format characters templates meet.
fn printable(c: char) -> bool {
    !(c.is_control()
        || (c.is_whitespace() && c != ' ')
        || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2060}'..='\u{2064}' | '\u{feff}')
        || ('\u{e000}'..='\u{f8ff}').contains(&c))
}

/// `json.dumps(value, ensure_ascii=..., indent=..., separators=..., sort_keys=...)`.
pub struct Json {
    pub ensure_ascii: bool,
    /// Spaces per level; `None` writes everything on one line.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl Default for Json {
    fn default() -> Self {
        Self {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        }
    }
}

impl Json {
    /// `value` as JSON, as Python's `json.dumps` writes it.
    pub fn dumps(&self, value: &Value) -> Result<String, Error> {
        let mut out = String::new();
        self.write(value, 0, &mut out)?;
        Ok(out)
    }

    fn newline(&self, level: usize, out: &mut String) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    }

    fn write(&self, value: &Value, level: usize, out: &mut String) -> Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if value.is_integer() {
                    let _ = write!(out, "{value}");
                } else {
                    let x = f64::try_from(value.clone())?;
                    if x.is_nan() {
                        out.push_str("NaN");
                    } else if x.is_infinite() {
                        out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" });
                    } else {
                        float(x, out);
                    }
                }
            }
            ValueKind::String => self.string(value.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_separator);
                    }
                    self.newline(level + 1, out);
                    self.write(item, level + 1, out)?;
                }
                self.newline(level, out);
                out.push(']');
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                if self.sort_keys {
                    keys.sort();
                }
                out.push('{');
                for (i, key) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_separator);
                    }
                    self.newline(level + 1, out);
                    self.key(key, out)?;
                    out.push_str(&self.key_separator);
                    self.write(&value.get_item(key)?, level + 1, out)?;
                }
                self.newline(level, out);
                out.push('}');
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {kind} is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }

    /// A key: strings as they are; numbers, booleans and None as JSON writes them, quoted.
    fn key(&self, key: &Value, out: &mut String) -> Result<(), Error> {
        match key.kind() {
            ValueKind::String => self.string(key.as_str().unwrap_or_default(), out),
            ValueKind::Number | ValueKind::Bool | ValueKind::None => {
                let mut text = String::new();
                self.write(key, 0, &mut text)?;
                self.string(&text, out);
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("keys must be str, int, float, bool or None, not {kind}"),
                ));
            }
        }
        Ok(())
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.ensure_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float_repr(x: f64) -> String {
        let mut out = String::new();
        float(x, &mut out);
        out
    }

    #[test]
    fn floats_read_as_python_writes_them() {
        for (x, python) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e-5, "1e-05"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456.789, "123456.789"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (0.0, "0.0"),
        ] {
            assert_eq!(float_repr(x), python, "{x}");
        }
    }

    #[test]
    fn reprs_quote_as_python_does() {
        let mut out = String::new();
        repr(
            &Value::from(vec![
                Value::from("it's"),
                Value::from("a\n\"b\""),
                Value::from(()),
                Value::from(true),
            ]),
            &mut out,
        )
        .unwrap();
        assert_eq!(out, r#"["it's", 'a\n"b"', None, True]"#);
    }
}
