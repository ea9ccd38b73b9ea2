//! Serde support: every type serializes as its string form.

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::ser::{self, Serializer};
use serde::{Deserialize, Serialize};

use crate::{AddrVec, EntityAddr, EntityKind, EntityName};

/// Deserializes any `FromStr` type from a string, borrowed or owned.
struct StrVisitor<T>(PhantomData<T>, &'static str);

impl<T> Visitor<'_> for StrVisitor<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.1)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        v.parse().map_err(E::custom)
    }
}

impl Serialize for EntityAddr {
    /// Fails (instead of writing text that would not parse back) when
    /// [`EntityAddr::validate`] fails.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.validate().map_err(ser::Error::custom)?;
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EntityAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor(
            PhantomData,
            "an address string like \"tcp://127.0.0.1:6800\"",
        ))
    }
}

impl Serialize for AddrVec {
    /// Fails when [`AddrVec::validate`] fails.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.validate().map_err(ser::Error::custom)?;
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AddrVec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor(
            PhantomData,
            "an address vector string like \"[verbs://198.51.100.1:6800,tcp://198.51.100.1:6801]\"",
        ))
    }
}

impl Serialize for EntityName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EntityName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor(
            PhantomData,
            "an entity name like \"client.4123\"",
        ))
    }
}

impl Serialize for EntityKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EntityKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor(
            PhantomData,
            "\"client\", \"server\" or \"peer\"",
        ))
    }
}
