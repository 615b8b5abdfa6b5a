//! Free-form objects of the spec (a model's `config.json`, the pod template)
//! read with a depth bound.
//!
//! The API server cannot bound how deep such an object nests: the CRD keeps
//! it with `x-kubernetes-preserve-unknown-fields`, and CEL does not see
//! fields the schema does not declare. A TrainingJob whose config nested about
//! 120 levels deep was stored, and serde_json's recursion limit (128 levels
//! from the document's root) then failed every LIST and watch of
//! TrainingJobs: the controller placed nothing, `vramfit status` failed.
//! Read through [`deserialize`], values below [`MAX_DEPTH`] levels of the
//! object are skipped (without recursion) and replaced by [`TOO_DEEP`], so one
//! such object fails only its own job, with the field named ([`too_deep`]).

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Levels of nesting kept below the object itself (a Hugging Face config
/// uses three or four, a pod template about a dozen).
pub const MAX_DEPTH: usize = 32;

/// What stands in for a value nested deeper than [`MAX_DEPTH`].
pub const TOO_DEEP: &str = "(vramfit: nested deeper than 32 levels, dropped)";

/// Deserializes an object, keeping [`MAX_DEPTH`] levels of nesting below it.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Map<String, Value>, D::Error> {
    d.deserialize_map(Bounded { depth: 0 })
        .and_then(|value| match value {
            Value::Object(map) => Ok(map),
            _ => Err(de::Error::custom("expected an object")),
        })
}

/// The path (`a.b[2].c`) of the first value that was dropped for nesting too
/// deep, `None` when nothing was.
pub fn too_deep(object: &Map<String, Value>) -> Option<String> {
    fn walk(value: &Value, path: &str) -> Option<String> {
        match value {
            Value::String(s) if s == TOO_DEEP => Some(path.to_owned()),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, v)| walk(v, &format!("{path}[{i}]"))),
            Value::Object(map) => map.iter().find_map(|(k, v)| {
                walk(
                    v,
                    &if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    },
                )
            }),
            _ => None,
        }
    }
    object.iter().find_map(|(k, v)| walk(v, k))
}

/// A value at `depth` levels below the object (the object itself is at
/// depth 0, its fields at 1).
#[derive(Clone, Copy)]
struct Bounded {
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Bounded {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        if self.depth > MAX_DEPTH {
            // Skipped without building anything; serde_json skips without
            // recursing, so its own limit is not reached either.
            <IgnoredAny as serde::Deserialize>::deserialize(d)?;
            return Ok(Value::String(TOO_DEEP.into()));
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Bounded {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = Bounded {
            depth: self.depth + 1,
        };
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(inner)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inner = Bounded {
            depth: self.depth + 1,
        };
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(inner)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
#[path = "free_form_tests.rs"]
mod tests;
