//! What every configuration struct shares: chained `with_*` setters and the checks their
//! `validate()` methods are written with.
//!
//! Every `*Config` is `#[non_exhaustive]` with public fields: read them directly, build one
//! from `Default` with the setters, and every constructor that takes one calls its
//! `validate()`, so a bad value is an [`Error::InvalidConfig`] naming the field.

use crate::error::Error;

/// Writes `with_<field>(self, value) -> Self` setters, each with its doc comment.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $field:ident: $ty:ty;)*) => {
        $(
            $(#[$doc])*
            #[must_use]
            pub fn $name(mut self, value: $ty) -> Self {
                self.$field = value;
                self
            }
        )*
    };
}
pub(crate) use setters;

/// `value` is a finite number within `range`.
pub(crate) fn float(
    field: &'static str,
    value: f64,
    range: core::ops::RangeInclusive<f64>,
    allowed: &'static str,
) -> Result<(), Error> {
    if value.is_finite() && range.contains(&value) {
        Ok(())
    } else {
        Err(invalid(field, value, allowed))
    }
}

/// `value` is an integer within `range`.
pub(crate) fn int<T: PartialOrd + core::fmt::Display>(
    field: &'static str,
    value: T,
    range: impl core::ops::RangeBounds<T>,
    allowed: &'static str,
) -> Result<(), Error> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(invalid(field, value, allowed))
    }
}

/// The error for `field = value`.
pub(crate) fn invalid(
    field: &'static str,
    value: impl core::fmt::Display,
    allowed: &'static str,
) -> Error {
    Error::InvalidConfig {
        field,
        value: value.to_string(),
        allowed,
    }
}
