//! The text selector: a compact, human-writable form of a [`Placement`], parsed by a
//! hand-written recursive-descent parser into the same structure the proto carries. Parse errors
//! carry the byte offset and what was expected there.
//!
//! # Grammar
//!
//! ```text
//! selector   = [ clause { "," clause } [ "," ] ]
//! clause     = "prefer" [ weight ] ":" condition      preference (weight defaults to 1)
//!            | "tolerates" name                       toleration, e.g. tolerates gpu
//!            | "needs" word ":" digits [ gpus ]       resource request, e.g. needs memory: 4096
//!            | "spread" "by" key                      spread, e.g. spread by custom_properties.region
//!            | condition                              hard constraint
//! condition  = "provides" name "@" major              capability ref, e.g. provides ai.llm@1
//!            | "!" key "?"                            NOT_EXISTS
//!            | "!" word                               NOT having the tag (tags NOT_IN [word])
//!            | key "?"                                EXISTS
//!            | key ( "=" | "==" ) value               EQ
//!            | key "!=" value                         NE
//!            | key ">" value | key ">=" value         GT, GTE
//!            | key "<" value | key "<=" value         LT, LTE
//!            | key "in" list                          IN
//!            | key "not" "in" list                    NOT_IN
//!            | key "@" raw                            VERSION, e.g. software.node.version@^20
//!            | key "~" raw                            REGEX, e.g. hostname~^build-
//!            | key "contains" value                   CONTAINS
//!            | key "contains" "any" list              CONTAINS_ANY
//!            | word                                   required tag
//! gpus       = "(" condition { "," condition } ")"   requirements each GPU must meet
//! list       = "(" value { "," value } [ "," ] ")"
//! value      = quoted | word                          see "Literals"
//! raw        = quoted | text up to the next "," (trimmed), e.g. >=2.30 <3 or ^18 || ^20
//! key, name  = quoted | word
//! word       = 1*( ASCII letter | digit | "_" | "." | "-" | "/" | "+" )
//! quoted     = '"' { any char but '"' and '\' | '\"' | '\\' | '\' other } '"'
//! weight     = digits (at least 1)       major = digits
//! ```
//!
//! Whitespace is allowed between any two tokens. `prefer`, `provides`, `tolerates`, `needs` and
//! `spread` are keywords only where the grammar expects them (`provides` or `tolerates` followed
//! by a name, `needs` by a word and `:`, `spread` by `by` and a key); elsewhere they are ordinary
//! words (a lone `tolerates` is a tag).
//!
//! A `needs` clause asks for a consumable resource: `slots`, `cpu` (millicores), `memory` (MB),
//! `gpus` — optionally with the conditions each GPU must meet, on the device's fields:
//! `needs gpus: 2 (memory_mb>=40000, model~H100)`, where an unquoted version range or regular
//! expression also ends at `)` — or any named countable resource the agents offer (`needs
//! licenses.matlab: 1`).
//!
//! Literals: a quoted value is always a string. An unquoted `true`, `false` or `null` is that
//! JSON value; an unquoted word that is a JSON number is a number — except as the operand of
//! `>`, `>=`, `<`, `<=`, where a word containing `.` stays a string so that `>=2.30` keeps its
//! trailing zero and compares as a version against version strings (and numerically against
//! numbers). Everything else is a string. A version range or regular expression containing `,`
//! must be quoted, e.g. `software.git.version@">=2.30, <3"`.
//!
//! Example: `linux, docker, !gpu, os=linux, memory.total>=16384, software.node.version@^20,
//! arch in (x86_64, aarch64), hostname~^build-, provides ai.llm@1, prefer 5: gpu, needs memory:
//! 4096, needs gpus: 1 (memory_mb>=40000)`.

use crate::error::SelectorError;
use crate::placement::{
    CapabilityRef, Operator, Placement, Preference, PreferenceCondition, Requirement,
};
use crate::version::VersionRange;
use serde_json::Value;

/// Parses a selector into a placement (to [`Placement::merge`] with the structured fields).
pub fn parse(text: &str) -> Result<Placement, SelectorError> {
    let mut p = Parser {
        text,
        pos: 0,
        nested: false,
    };
    let mut placement = Placement::default();
    p.ws();
    if p.at_end() {
        return Ok(placement);
    }
    loop {
        p.clause(&mut placement)?;
        p.ws();
        if p.at_end() {
            return Ok(placement);
        }
        p.expect(b',', "',' or end of input")?;
        p.ws();
        if p.at_end() {
            return Ok(placement);
        }
    }
}

enum Condition {
    Tag(String),
    Requirement(Requirement),
    Capability(CapabilityRef),
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    /// Inside a GPU condition list, where an unquoted raw operand also ends at `)`.
    nested: bool,
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'/' | b'+')
}

impl<'a> Parser<'a> {
    fn at_end(&self) -> bool {
        self.pos >= self.text.len()
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    fn found(&self) -> String {
        match self.text[self.pos..].chars().next() {
            None => "end of input".to_owned(),
            Some(c) => format!("'{c}'"),
        }
    }

    fn error_at(&self, offset: usize, expected: &str) -> SelectorError {
        let save = Parser {
            text: self.text,
            pos: offset,
            nested: self.nested,
        };
        SelectorError {
            offset,
            expected: expected.to_owned(),
            found: save.found(),
        }
    }

    fn error(&self, expected: &str) -> SelectorError {
        self.error_at(self.pos, expected)
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, b: u8, expected: &str) -> Result<(), SelectorError> {
        if self.eat(b) {
            Ok(())
        } else {
            Err(self.error(expected))
        }
    }

    /// The next unquoted word without consuming it.
    fn peek_word(&self) -> &'a str {
        let rest = &self.text[self.pos..];
        let len = rest.bytes().take_while(|b| is_word_byte(*b)).count();
        &rest[..len]
    }

    fn word(&mut self) -> Option<&'a str> {
        let w = self.peek_word();
        if w.is_empty() {
            None
        } else {
            self.pos += w.len();
            Some(w)
        }
    }

    fn quoted(&mut self) -> Result<String, SelectorError> {
        let start = self.pos;
        self.pos += 1; // opening quote
        let mut out = String::new();
        let mut chars = self.text[self.pos..].char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.pos += i + 1;
                    return Ok(out);
                }
                '\\' => match chars.next() {
                    Some((_, '"')) => out.push('"'),
                    Some((_, '\\')) => out.push('\\'),
                    Some((_, other)) => {
                        out.push('\\');
                        out.push(other);
                    }
                    None => break,
                },
                c => out.push(c),
            }
        }
        self.pos = self.text.len();
        Err(SelectorError {
            offset: start,
            expected: "a closing '\"'".to_owned(),
            found: "end of input".to_owned(),
        })
    }

    /// A key, name or tag: quoted or a word.
    fn name(&mut self, expected: &str) -> Result<(String, bool), SelectorError> {
        if self.peek() == Some(b'"') {
            return Ok((self.quoted()?, true));
        }
        self.word()
            .map(|w| (w.to_owned(), false))
            .ok_or_else(|| self.error(expected))
    }

    fn digits(&mut self, expected: &str) -> Result<u32, SelectorError> {
        let start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error(expected));
        }
        self.text[start..self.pos]
            .parse()
            .map_err(|_| self.error_at(start, &format!("{expected} (at most {})", u32::MAX)))
    }

    fn value(&mut self, ordering: bool) -> Result<Value, SelectorError> {
        if self.peek() == Some(b'"') {
            return Ok(Value::String(self.quoted()?));
        }
        let w = self.word().ok_or_else(|| self.error("a value"))?;
        Ok(literal(w, ordering))
    }

    fn list(&mut self) -> Result<Vec<Value>, SelectorError> {
        self.expect(b'(', "'(' starting a list")?;
        let mut values = Vec::new();
        loop {
            self.ws();
            if self.eat(b')') {
                if values.is_empty() {
                    return Err(self.error_at(self.pos - 1, "a value"));
                }
                return Ok(values);
            }
            values.push(self.value(false)?);
            self.ws();
            if self.eat(b')') {
                return Ok(values);
            }
            self.expect(b',', "',' or ')'")?;
        }
    }

    /// Quoted text, or everything up to the next ',' trimmed.
    fn raw(&mut self, expected: &str) -> Result<(usize, String), SelectorError> {
        self.ws();
        let start = self.pos;
        if self.peek() == Some(b'"') {
            return Ok((start, self.quoted()?));
        }
        let rest = &self.text[self.pos..];
        let end = |b: char| b == ',' || (self.nested && b == ')');
        let len = rest.find(end).unwrap_or(rest.len());
        let raw = rest[..len].trim_end();
        if raw.is_empty() {
            return Err(self.error(expected));
        }
        self.pos += raw.len();
        Ok((start, raw.to_owned()))
    }

    fn clause(&mut self, placement: &mut Placement) -> Result<(), SelectorError> {
        if self.peek_word() == "prefer" {
            let save = self.pos;
            self.pos += "prefer".len();
            self.ws();
            if matches!(self.peek(), Some(b':' | b'0'..=b'9')) {
                let at = self.pos;
                let weight = if self.eat(b':') {
                    1
                } else {
                    let w = self.digits("a weight")?;
                    self.ws();
                    self.expect(b':', "':' after the weight")?;
                    w
                };
                if weight == 0 {
                    return Err(self.error_at(at, "a weight of at least 1"));
                }
                self.ws();
                let condition = match self.condition()? {
                    Condition::Tag(t) => PreferenceCondition::Tag(t),
                    Condition::Requirement(r) => PreferenceCondition::Requirement(r),
                    Condition::Capability(c) => PreferenceCondition::Capability(c),
                };
                placement.preferences.push(Preference { weight, condition });
                return Ok(());
            }
            self.pos = save;
        }
        if self.peek_word() == "spread" {
            let save = self.pos;
            self.pos += "spread".len();
            self.ws();
            if self.peek_word() == "by" {
                self.pos += "by".len();
                let spaced = self.peek().is_some_and(|b| b.is_ascii_whitespace());
                self.ws();
                if spaced && (self.peek() == Some(b'"') || !self.peek_word().is_empty()) {
                    let (key, _) = self.name("a document key")?;
                    placement.spread_by = Some(key);
                    return Ok(());
                }
            }
            self.pos = save;
        }
        if self.peek_word() == "needs" {
            let save = self.pos;
            if self.needs(placement)? {
                return Ok(());
            }
            self.pos = save;
        }
        if self.peek_word() == "tolerates" {
            let save = self.pos;
            self.pos += "tolerates".len();
            let spaced = self.peek().is_some_and(|b| b.is_ascii_whitespace());
            self.ws();
            if spaced && (self.peek() == Some(b'"') || !self.peek_word().is_empty()) {
                let (taint, _) = self.name("a taint")?;
                placement.tolerations.push(taint);
                return Ok(());
            }
            self.pos = save;
        }
        match self.condition()? {
            Condition::Tag(t) => placement.required_tags.push(t),
            Condition::Requirement(r) => placement.requirements.push(r),
            Condition::Capability(c) => placement.capabilities.push(c),
        }
        Ok(())
    }

    /// `needs NAME: AMOUNT [ "(" GPU conditions ")" ]`, at `needs`: false (nothing consumed
    /// that matters) when it is not such a clause.
    fn needs(&mut self, placement: &mut Placement) -> Result<bool, SelectorError> {
        self.pos += "needs".len();
        if !self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            return Ok(false);
        }
        self.ws();
        let Some(name) = self.word() else {
            return Ok(false);
        };
        self.ws();
        if !self.eat(b':') {
            return Ok(false);
        }
        self.ws();
        let at = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
        let amount: u64 = self.text[at..self.pos]
            .parse()
            .map_err(|_| self.error_at(at, "an amount (digits)"))?;
        let request = placement.resources.get_or_insert_with(Default::default);
        let small = |p: &Self| {
            u32::try_from(amount).map_err(|_| p.error_at(at, &format!("at most {}", u32::MAX)))
        };
        match name {
            "slots" => request.slots = small(self)?,
            "cpu" | "cpu_millicores" => request.cpu_millicores = amount,
            "memory" | "memory_mb" => request.memory_mb = amount,
            "gpus" | "gpu" => {
                request.gpus = small(self)?;
                self.ws();
                if self.peek() == Some(b'(') {
                    self.pos += 1;
                    self.nested = true;
                    loop {
                        self.ws();
                        let start = self.pos;
                        match self.condition()? {
                            Condition::Requirement(r) => request.gpu_requirements.push(r),
                            _ => {
                                return Err(self.error_at(start, "a requirement on a GPU field"));
                            }
                        }
                        self.ws();
                        if self.eat(b')') {
                            self.nested = false;
                            break;
                        }
                        self.expect(b',', "',' or ')' closing the GPU conditions")?;
                    }
                }
            }
            other => {
                request.named.insert(other.to_owned(), amount);
            }
        }
        Ok(true)
    }

    fn condition(&mut self) -> Result<Condition, SelectorError> {
        if self.eat(b'!') {
            self.ws();
            let (key, _) = self.name("a tag or key after '!'")?;
            self.ws();
            if self.eat(b'?') {
                return Ok(Condition::Requirement(Requirement::new(
                    key,
                    Operator::NotExists,
                    vec![],
                )));
            }
            return Ok(Condition::Requirement(Requirement::new(
                "tags",
                Operator::NotIn,
                vec![Value::String(key)],
            )));
        }
        let (key, quoted) = self.name("a tag, key or 'provides'")?;
        let after_key = self.pos;
        self.ws();
        if !quoted
            && key == "provides"
            && (self.peek() == Some(b'"') || !self.peek_word().is_empty())
        {
            let (name, _) = self.name("a capability name")?;
            self.ws();
            self.expect(b'@', "'@' and a major version after the capability name")?;
            self.ws();
            let major = self.digits("a major version number")?;
            return Ok(Condition::Capability(CapabilityRef { name, major }));
        }
        let req = |op: Operator, values: Vec<Value>| {
            Ok(Condition::Requirement(Requirement::new(
                key.clone(),
                op,
                values,
            )))
        };
        match self.peek() {
            Some(b'?') => {
                self.pos += 1;
                req(Operator::Exists, vec![])
            }
            Some(b'=') => {
                self.pos += 1;
                self.eat(b'=');
                self.ws();
                let v = self.value(false)?;
                req(Operator::Eq, vec![v])
            }
            Some(b'!') => {
                self.pos += 1;
                self.expect(b'=', "'=' after '!'")?;
                self.ws();
                let v = self.value(false)?;
                req(Operator::Ne, vec![v])
            }
            Some(b'>' | b'<') => {
                let greater = self.peek() == Some(b'>');
                self.pos += 1;
                let or_equal = self.eat(b'=');
                let op = match (greater, or_equal) {
                    (true, false) => Operator::Gt,
                    (true, true) => Operator::Gte,
                    (false, false) => Operator::Lt,
                    (false, true) => Operator::Lte,
                };
                self.ws();
                let v = self.value(true)?;
                req(op, vec![v])
            }
            Some(b'@') => {
                self.pos += 1;
                let (at, range) = self.raw("a version range after '@'")?;
                if let Err(e) = VersionRange::parse(&range) {
                    return Err(self.error_at(at, &format!("a version range ({})", e.reason)));
                }
                req(Operator::Version, vec![Value::String(range)])
            }
            Some(b'~') => {
                self.pos += 1;
                let (at, pattern) = self.raw("a regular expression after '~'")?;
                if let Err(e) = regex::RegexBuilder::new(&pattern)
                    .size_limit(1 << 20)
                    .build()
                {
                    let first_line = e
                        .to_string()
                        .lines()
                        .last()
                        .unwrap_or("invalid")
                        .trim()
                        .to_owned();
                    return Err(self.error_at(at, &format!("a regular expression ({first_line})")));
                }
                req(Operator::Regex, vec![Value::String(pattern)])
            }
            _ => match self.peek_word() {
                "in" if self.pos > after_key => {
                    self.pos += 2;
                    self.ws();
                    let values = self.list()?;
                    req(Operator::In, values)
                }
                "not" if self.pos > after_key => {
                    self.pos += 3;
                    self.ws();
                    if self.peek_word() != "in" {
                        return Err(self.error("'in' after 'not'"));
                    }
                    self.pos += 2;
                    self.ws();
                    let values = self.list()?;
                    req(Operator::NotIn, values)
                }
                "contains" if self.pos > after_key => {
                    self.pos += "contains".len();
                    self.ws();
                    if self.peek_word() == "any" {
                        let save = self.pos;
                        self.pos += 3;
                        self.ws();
                        if self.peek() == Some(b'(') {
                            let values = self.list()?;
                            return req(Operator::ContainsAny, values);
                        }
                        self.pos = save;
                    }
                    let v = self.value(false)?;
                    req(Operator::Contains, vec![v])
                }
                _ => {
                    // A bare tag: what follows must end the clause.
                    self.pos = after_key;
                    let end = self.pos;
                    self.ws();
                    if self.at_end() || self.peek() == Some(b',') {
                        self.pos = end;
                        Ok(Condition::Tag(key))
                    } else {
                        Err(self.error(
                            "an operator (?, =, !=, >, >=, <, <=, @, ~, in, not in, contains) or ','",
                        ))
                    }
                }
            },
        }
    }
}

/// An unquoted literal as JSON (see the module doc).
fn literal(word: &str, ordering: bool) -> Value {
    match word {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        "null" => return Value::Null,
        _ => {}
    }
    let numeric = word
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_digit() || b == b'-');
    if numeric
        && !(ordering && word.contains('.'))
        && let Ok(n @ Value::Number(_)) = serde_json::from_str::<Value>(word)
    {
        return n;
    }
    Value::String(word.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(text: &str) -> Value {
        serde_json::to_value(parse(text).unwrap()).unwrap()
    }

    fn r(key: &str, op: &str, values: Value) -> Value {
        json!({"key": key, "operator": op, "values": values})
    }

    #[test]
    fn empty_selector() {
        assert_eq!(parse("").unwrap(), Placement::default());
        assert_eq!(parse("  ,").unwrap_err().offset, 2);
    }

    #[test]
    fn the_issue_example() {
        let got = p(
            "linux, docker, !gpu, os=linux, memory.total>=16384, software.node.version@^20, arch in (x86_64, aarch64), hostname~^build-, provides ai.llm@1",
        );
        assert_eq!(
            got,
            json!({
                "required_tags": ["linux", "docker"],
                "requirements": [
                    r("tags", "NOT_IN", json!(["gpu"])),
                    r("os", "EQ", json!(["linux"])),
                    r("memory.total", "GTE", json!([16384])),
                    r("software.node.version", "VERSION", json!(["^20"])),
                    r("arch", "IN", json!(["x86_64", "aarch64"])),
                    r("hostname", "REGEX", json!(["^build-"])),
                ],
                "capabilities": [{"name": "ai.llm", "major": 1}],
                "preferences": []
            })
        );
    }

    #[test]
    fn tolerations() {
        let got = parse(r#"gpu, tolerates gpu, tolerates "pool-a", tolerates"#).unwrap();
        assert_eq!(got.required_tags, vec!["gpu", "tolerates"]);
        assert_eq!(got.tolerations, vec!["gpu", "pool-a"]);
        // Not followed by a name, `tolerates` is an ordinary key.
        let key = parse("tolerates=1").unwrap();
        assert!(key.tolerations.is_empty());
        assert_eq!(key.requirements[0].key, "tolerates");
    }

    #[test]
    fn resource_requests() {
        let got = parse(
            r#"linux, needs cpu: 2000, needs memory: 4096, needs slots: 2, needs gpus: 2 (memory_mb>=40000, model~H100), needs licenses.matlab: 1, needs"#,
        )
        .unwrap();
        let r = got.resources.unwrap();
        assert_eq!(
            (r.cpu_millicores, r.memory_mb, r.slots, r.gpus),
            (2000, 4096, 2, 2)
        );
        let keys: Vec<&str> = r.gpu_requirements.iter().map(|q| q.key.as_str()).collect();
        assert_eq!(keys, ["memory_mb", "model"]);
        assert_eq!(r.gpu_requirements[1].values, [Value::from("H100")]);
        assert_eq!(r.named.get("licenses.matlab"), Some(&1));
        assert_eq!(got.required_tags, ["linux", "needs"]);
        let spread = parse("spread by custom_properties.region, spread, spread=1").unwrap();
        assert_eq!(
            spread.spread_by.as_deref(),
            Some("custom_properties.region")
        );
        assert_eq!(spread.required_tags, ["spread"]);
        assert_eq!(spread.requirements[0].key, "spread");
        // Not followed by a word and ':', `needs` is an ordinary key or tag.
        assert!(parse("needs=1").unwrap().resources.is_none());
        let err = parse("needs gpus: x").unwrap_err();
        assert_eq!(
            (err.offset, err.expected.as_str()),
            (12, "an amount (digits)")
        );
        let err = parse("needs gpus: 1 (provides cuda@12)").unwrap_err();
        assert_eq!(err.expected, "a requirement on a GPU field");
    }

    #[test]
    fn every_operator() {
        let got = parse(
            "a?, !b?, c = 1, c2==x, d != \"two words\", e > 1.5, f >= 2, g < 3, h <= 4, i in (1, true, null), j not in (x), \
             k @ >=2.30 <3, l ~ \"a{1,3}\", m contains v, n contains any (p, q), o contains any",
        )
        .unwrap();
        let ops: Vec<&str> = got
            .requirements
            .iter()
            .map(|r| r.operator.as_str())
            .collect();
        assert_eq!(
            ops,
            vec![
                "EXISTS",
                "NOT_EXISTS",
                "EQ",
                "EQ",
                "NE",
                "GT",
                "GTE",
                "LT",
                "LTE",
                "IN",
                "NOT_IN",
                "VERSION",
                "REGEX",
                "CONTAINS",
                "CONTAINS_ANY",
                "CONTAINS"
            ]
        );
        assert_eq!(got.requirements[2].values, vec![json!(1)]);
        assert_eq!(got.requirements[4].values, vec![json!("two words")]);
        assert_eq!(got.requirements[5].values, vec![json!("1.5")]);
        assert_eq!(got.requirements[6].values, vec![json!(2)]);
        assert_eq!(
            got.requirements[9].values,
            vec![json!(1), json!(true), json!(null)]
        );
        assert_eq!(got.requirements[11].values, vec![json!(">=2.30 <3")]);
        assert_eq!(got.requirements[12].values, vec![json!("a{1,3}")]);
        assert_eq!(got.requirements[15].values, vec![json!("any")]);
    }

    #[test]
    fn preferences() {
        let got = parse("prefer 5: gpu, prefer: provides ai.llm@2, prefer 2: memory.total>=32768, prefer 1: !busy, prefer").unwrap();
        assert_eq!(got.preferences.len(), 4);
        assert_eq!(
            got.preferences[0],
            Preference {
                weight: 5,
                condition: PreferenceCondition::Tag("gpu".into())
            }
        );
        assert_eq!(got.preferences[1].weight, 1);
        assert!(matches!(
            got.preferences[1].condition,
            PreferenceCondition::Capability(_)
        ));
        assert_eq!(got.required_tags, vec!["prefer"]);
    }

    #[test]
    fn keywords_as_tags_and_quoted_keys() {
        let got = parse("provides, \"weird key\" = 1, \"c++\"").unwrap();
        assert_eq!(got.required_tags, vec!["provides", "c++"]);
        assert_eq!(got.requirements[0].key, "weird key");
    }

    #[test]
    fn errors_say_where_and_what() {
        let e = parse("linux, os=").unwrap_err();
        assert_eq!(
            (e.offset, e.expected.as_str(), e.found.as_str()),
            (10, "a value", "end of input")
        );
        let e = parse("linux docker").unwrap_err();
        assert_eq!(e.offset, 6);
        assert!(e.expected.starts_with("an operator"));
        let e = parse("arch in x86_64").unwrap_err();
        assert_eq!((e.offset, e.expected.as_str()), (8, "'(' starting a list"));
        let e = parse("provides ai.llm").unwrap_err();
        assert_eq!(e.offset, 15);
        let e = parse("provides ai.llm@x").unwrap_err();
        assert_eq!(
            (e.offset, e.expected.as_str()),
            (16, "a major version number")
        );
        let e = parse("v@^x.1").unwrap_err();
        assert_eq!(e.offset, 2);
        assert!(e.expected.starts_with("a version range"));
        let e = parse("h~(").unwrap_err();
        assert_eq!(e.offset, 2);
        let e = parse("a = \"open").unwrap_err();
        assert_eq!((e.offset, e.expected.as_str()), (4, "a closing '\"'"));
        let e = parse("prefer 0: gpu").unwrap_err();
        assert_eq!(e.offset, 7);
        let e = parse("a not x").unwrap_err();
        assert_eq!(e.expected, "'in' after 'not'");
        let e = parse("a in ()").unwrap_err();
        assert_eq!(e.offset, 6);
        assert_eq!(e.to_string(), "at byte 6: expected a value, found ')'");
    }

    #[test]
    fn literals() {
        assert_eq!(literal("16384", false), json!(16384));
        assert_eq!(literal("-2", false), json!(-2));
        assert_eq!(literal("0.5", false), json!(0.5));
        assert_eq!(literal("0.5", true), json!("0.5"));
        assert_eq!(literal("20", true), json!(20));
        assert_eq!(literal("1.2.3", false), json!("1.2.3"));
        assert_eq!(literal("x86_64", false), json!("x86_64"));
        assert_eq!(literal("007", false), json!("007"));
    }
}
