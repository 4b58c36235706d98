//! Token IDs from Python: a list or tuple of ints, or an array of integers (NumPy,
//! `array.array`, a `memoryview`).
//!
//! The wheel targets the stable ABI from CPython 3.9, whose limited API has no buffer
//! protocol (it came in 3.11), so an array is read through its own `tobytes()`: one bulk
//! copy by the exporter, then one pass in Rust that checks each value fits a `u32`. No
//! Python object is made per token.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::errors::invalid_tokens;

/// How an array's items are laid out: signed or not, and bytes per item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    signed: bool,
    size: usize,
}

/// The tokens `obj` holds.
///
/// # Errors
///
/// `InvalidTokens` (a `ValueError`) for a value outside `0..=u32::MAX` (naming its position) or an array that
/// is not one-dimensional; `TypeError` for anything that is not a sequence or array of
/// integers.
pub(crate) fn extract(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return from_sequence(obj);
    }
    if let Some(layout) = array_layout(obj)? {
        let bytes = obj.call_method0("tobytes")?;
        let bytes = bytes.cast::<PyBytes>()?;
        return from_bytes(bytes.as_bytes(), layout);
    }
    if obj.is_instance_of::<PyBytes>() || obj.is_instance_of::<pyo3::types::PyString>() {
        return Err(PyTypeError::new_err(
            "token IDs are integers: pass a list, a tuple or an integer array, not bytes or str",
        ));
    }
    from_sequence(obj)
}

/// A list, tuple or other iterable of ints.
fn from_sequence(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    if let Ok(tokens) = obj.extract::<Vec<u32>>() {
        return Ok(tokens);
    }
    // Say which item is wrong, and why.
    let mut out = Vec::new();
    for (i, item) in obj.try_iter()?.enumerate() {
        let item = item?;
        match item.extract::<i128>() {
            Ok(v) => out.push(checked(i, v)?),
            Err(_) => {
                return Err(PyTypeError::new_err(format!(
                    "token {i} is {}, not an integer",
                    item.get_type().name()?
                )));
            }
        }
    }
    Ok(out)
}

/// A token's value, or an error naming it.
fn checked(position: usize, value: i128) -> PyResult<u32> {
    u32::try_from(value).map_err(|_| {
        invalid_tokens(format!(
            "token {position} is {value}: token IDs are 0 to {}",
            u32::MAX
        ))
    })
}

/// The item layout of a NumPy array, an `array.array` or a `memoryview`; `None` for any
/// other object.
fn array_layout(obj: &Bound<'_, PyAny>) -> PyResult<Option<Layout>> {
    if let Ok(dtype) = obj.getattr("dtype") {
        return numpy_layout(obj, &dtype).map(Some);
    }
    if let Ok(code) = obj.getattr("typecode") {
        let size: usize = obj.getattr("itemsize")?.extract()?;
        return format_layout(&code.extract::<String>()?, size).map(Some);
    }
    if obj.is_instance_of::<pyo3::types::PyMemoryView>() {
        let ndim: usize = obj.getattr("ndim")?.extract()?;
        one_dimensional(ndim)?;
        let size: usize = obj.getattr("itemsize")?.extract()?;
        let format: String = obj.getattr("format")?.extract()?;
        return format_layout(format.trim_start_matches(['@', '=', '<']), size).map(Some);
    }
    Ok(None)
}

fn numpy_layout(obj: &Bound<'_, PyAny>, dtype: &Bound<'_, PyAny>) -> PyResult<Layout> {
    let ndim: usize = obj.getattr("ndim")?.extract()?;
    one_dimensional(ndim)?;
    let kind: String = dtype.getattr("kind")?.extract()?;
    let size: usize = dtype.getattr("itemsize")?.extract()?;
    let order: String = dtype.getattr("byteorder")?.extract()?;
    let native =
        matches!(order.as_str(), "=" | "|") || (order == "<") == cfg!(target_endian = "little");
    match kind.as_str() {
        "u" | "i" if native && matches!(size, 1 | 2 | 4 | 8) => Ok(Layout {
            signed: kind == "i",
            size,
        }),
        _ => Err(PyTypeError::new_err(format!(
            "token IDs are integers: an array of dtype kind '{kind}', {size} bytes, byte order '{order}' cannot hold them (use uint32)"
        ))),
    }
}

/// The layout a `struct` format character names (`array.array`'s typecode, a memoryview's
/// format).
fn format_layout(code: &str, size: usize) -> PyResult<Layout> {
    let signed = match code {
        "b" | "h" | "i" | "l" | "q" | "n" => true,
        "B" | "H" | "I" | "L" | "Q" | "N" => false,
        other => {
            return Err(PyTypeError::new_err(format!(
                "token IDs are integers: an array of format '{other}' cannot hold them (use 'I')"
            )));
        }
    };
    if !matches!(size, 1 | 2 | 4 | 8) {
        return Err(PyTypeError::new_err(format!(
            "an array of {size}-byte items cannot hold token IDs"
        )));
    }
    Ok(Layout { signed, size })
}

fn one_dimensional(ndim: usize) -> PyResult<()> {
    if ndim == 1 {
        Ok(())
    } else {
        Err(invalid_tokens(format!(
            "token IDs are a one-dimensional array, not one of {ndim} dimensions"
        )))
    }
}

/// Native-endian items of `layout` as tokens.
fn from_bytes(bytes: &[u8], layout: Layout) -> PyResult<Vec<u32>> {
    if layout
        == (Layout {
            signed: false,
            size: 4,
        })
    {
        return Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect());
    }
    bytes
        .chunks_exact(layout.size)
        .enumerate()
        .map(|(i, c)| checked(i, value(c, layout.signed)))
        .collect()
}

/// One native-endian integer of 1, 2, 4 or 8 bytes.
fn value(item: &[u8], signed: bool) -> i128 {
    let mut wide = [0u8; 8];
    let top = if cfg!(target_endian = "little") {
        item.last()
    } else {
        item.first()
    };
    let fill = if signed && top.is_some_and(|b| b & 0x80 != 0) {
        0xff
    } else {
        0
    };
    if cfg!(target_endian = "little") {
        wide[..item.len()].copy_from_slice(item);
        wide[item.len()..].fill(fill);
    } else {
        wide[8 - item.len()..].copy_from_slice(item);
        wide[..8 - item.len()].fill(fill);
    }
    if signed {
        i128::from(i64::from_ne_bytes(wide))
    } else {
        i128::from(u64::from_ne_bytes(wide))
    }
}
