//! Entry metadata: scalar and list values with one canonical form (no floats, no nesting).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

/// A metadata value that may appear inside a list: string, integer, boolean or null.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MetaScalar {
    /// JSON `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer. Floats are not allowed: their text form is not canonical.
    Int(i64),
    /// A string (redacted before it is written).
    Str(String),
}

/// A metadata value: a [`MetaScalar`] or a list of them (no nesting deeper than that).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MetaValue {
    /// JSON `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer. Floats are not allowed: their text form is not canonical.
    Int(i64),
    /// A string (redacted before it is written).
    Str(String),
    /// A list of scalars.
    List(Vec<MetaScalar>),
}

/// Entry metadata: keys sorted bytewise (a `BTreeMap` iterates that way), so it has one form.
pub type Metadata = BTreeMap<String, MetaValue>;

macro_rules! from_impls {
    ($target:ident) => {
        impl From<bool> for $target {
            fn from(value: bool) -> Self {
                Self::Bool(value)
            }
        }
        impl From<i64> for $target {
            fn from(value: i64) -> Self {
                Self::Int(value)
            }
        }
        impl From<i32> for $target {
            fn from(value: i32) -> Self {
                Self::Int(value.into())
            }
        }
        impl From<u32> for $target {
            fn from(value: u32) -> Self {
                Self::Int(value.into())
            }
        }
        impl From<&str> for $target {
            fn from(value: &str) -> Self {
                Self::Str(value.to_owned())
            }
        }
        impl From<String> for $target {
            fn from(value: String) -> Self {
                Self::Str(value)
            }
        }
    };
}
from_impls!(MetaScalar);
from_impls!(MetaValue);

impl<T: Into<MetaScalar>> From<Vec<T>> for MetaValue {
    fn from(values: Vec<T>) -> Self {
        Self::List(values.into_iter().map(Into::into).collect())
    }
}

impl From<MetaScalar> for MetaValue {
    fn from(value: MetaScalar) -> Self {
        match value {
            MetaScalar::Null => Self::Null,
            MetaScalar::Bool(b) => Self::Bool(b),
            MetaScalar::Int(i) => Self::Int(i),
            MetaScalar::Str(s) => Self::Str(s),
        }
    }
}

impl Serialize for MetaScalar {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Null => serializer.serialize_unit(),
            Self::Bool(b) => serializer.serialize_bool(*b),
            Self::Int(i) => serializer.serialize_i64(*i),
            Self::Str(s) => serializer.serialize_str(s),
        }
    }
}

impl Serialize for MetaValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Null => serializer.serialize_unit(),
            Self::Bool(b) => serializer.serialize_bool(*b),
            Self::Int(i) => serializer.serialize_i64(*i),
            Self::Str(s) => serializer.serialize_str(s),
            Self::List(items) => serializer.collect_seq(items),
        }
    }
}

// Reads metadata values, refusing what the canonical form excludes with a message that says so.
struct MetaVisitor {
    allow_list: bool,
}

impl<'de> Visitor<'de> for MetaVisitor {
    type Value = MetaValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.allow_list {
            f.write_str("a string, integer, boolean, null, or a list of those")
        } else {
            f.write_str("a string, integer, boolean or null")
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<MetaValue, E> {
        Ok(MetaValue::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<MetaValue, E> {
        Ok(MetaValue::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<MetaValue, E> {
        Ok(MetaValue::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<MetaValue, E> {
        Ok(MetaValue::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<MetaValue, E> {
        i64::try_from(v)
            .map(MetaValue::Int)
            .map_err(|_| E::custom(format!("metadata integer {v} is beyond the i64 range")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<MetaValue, E> {
        Err(E::custom(format!(
            "metadata holds the float {v}; floats are not allowed (their text is not canonical)"
        )))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<MetaValue, E> {
        Ok(MetaValue::Str(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<MetaValue, E> {
        Ok(MetaValue::Str(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MetaValue, A::Error> {
        if !self.allow_list {
            return Err(de::Error::custom(
                "metadata lists may not contain lists (one level only)",
            ));
        }
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<MetaScalar>()? {
            items.push(item);
        }
        Ok(MetaValue::List(items))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, _map: A) -> Result<MetaValue, A::Error> {
        Err(de::Error::custom(
            "metadata values may not be objects (flatten them into keys)",
        ))
    }
}

impl<'de> Deserialize<'de> for MetaValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MetaVisitor { allow_list: true })
    }
}

impl<'de> Deserialize<'de> for MetaScalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match deserializer.deserialize_any(MetaVisitor { allow_list: false })? {
            MetaValue::Null => Ok(Self::Null),
            MetaValue::Bool(b) => Ok(Self::Bool(b)),
            MetaValue::Int(i) => Ok(Self::Int(i)),
            MetaValue::Str(s) => Ok(Self::Str(s)),
            // The visitor refuses lists when allow_list is false.
            MetaValue::List(_) => Err(de::Error::custom("unexpected list")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_refuses_floats_objects_and_nested_lists() {
        for bad in [
            r#"{"x":1.5}"#,
            r#"{"x":{"y":1}}"#,
            r#"{"x":[[1]]}"#,
            r#"{"x":18446744073709551615}"#,
        ] {
            assert!(serde_json::from_str::<Metadata>(bad).is_err(), "{bad}");
        }
        let ok: Metadata = serde_json::from_str(r#"{"a":[1,"x",null,true],"b":-3}"#).unwrap();
        assert_eq!(ok["b"], MetaValue::Int(-3));
    }
}
