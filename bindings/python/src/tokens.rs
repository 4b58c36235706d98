//! Token IDs from Python: a list or tuple of ints, or an array of integers (NumPy,
//! `array.array`, a `memoryview`).
//!
//! The wheel targets the stable ABI from CPython 3.9, whose limited API has no buffer
//! protocol (it came in 3.11), so an array is read through its own `tobytes()`: one bulk
//! copy by the exporter, then one pass in Rust that checks each value fits a `u32`. No
//! Python object is made per token.

use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PyTuple, PyType};

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
        let bytes = obj.call_method0(intern!(obj.py(), "tobytes"))?;
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

/// The item layout of an `array.array`, a `memoryview` or a NumPy array; `None` for any
/// other object. The standard library's types are recognised by type, so that only a
/// NumPy array is asked for its `dtype` (a failed attribute lookup costs an exception).
fn array_layout(obj: &Bound<'_, PyAny>) -> PyResult<Option<Layout>> {
    static ARRAY: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let py = obj.py();
    if obj.is_instance(ARRAY.import(py, "array", "array")?)? {
        let size: usize = obj.getattr(intern!(obj.py(), "itemsize"))?.extract()?;
        let code = obj.getattr(intern!(obj.py(), "typecode"))?;
        return format_layout(&code.extract::<String>()?, size).map(Some);
    }
    if obj.is_instance_of::<pyo3::types::PyMemoryView>() {
        let ndim: usize = obj.getattr(intern!(obj.py(), "ndim"))?.extract()?;
        one_dimensional(ndim)?;
        let size: usize = obj.getattr(intern!(obj.py(), "itemsize"))?.extract()?;
        let format: String = obj.getattr(intern!(obj.py(), "format"))?.extract()?;
        return format_layout(format.trim_start_matches(['@', '=', '<']), size).map(Some);
    }
    match obj.getattr(intern!(obj.py(), "dtype")) {
        Ok(dtype) => numpy_layout(obj, &dtype).map(Some),
        Err(_) => Ok(None),
    }
}

/// NumPy's type numbers of its integer types (`dtype.num`), with their layouts.
const NUMPY_INTEGERS: [(u8, Layout); 10] = [
    (
        1,
        Layout {
            signed: true,
            size: 1,
        },
    ), // byte
    (
        2,
        Layout {
            signed: false,
            size: 1,
        },
    ), // ubyte
    (
        3,
        Layout {
            signed: true,
            size: 2,
        },
    ), // short
    (
        4,
        Layout {
            signed: false,
            size: 2,
        },
    ), // ushort
    (
        5,
        Layout {
            signed: true,
            size: 4,
        },
    ), // int
    (
        6,
        Layout {
            signed: false,
            size: 4,
        },
    ), // uint
    (
        7,
        Layout {
            signed: true,
            size: 0,
        },
    ), // long: its size is the platform's
    (
        8,
        Layout {
            signed: false,
            size: 0,
        },
    ), // ulong
    (
        9,
        Layout {
            signed: true,
            size: 8,
        },
    ), // longlong
    (
        10,
        Layout {
            signed: false,
            size: 8,
        },
    ), // ulonglong
];

fn numpy_layout(obj: &Bound<'_, PyAny>, dtype: &Bound<'_, PyAny>) -> PyResult<Layout> {
    let ndim: usize = obj.getattr(intern!(obj.py(), "ndim"))?.extract()?;
    one_dimensional(ndim)?;
    let num: i64 = dtype.getattr(intern!(obj.py(), "num"))?.extract()?;
    let native: bool = dtype.getattr(intern!(obj.py(), "isnative"))?.extract()?;
    let known = NUMPY_INTEGERS.iter().find(|(n, _)| i64::from(*n) == num);
    match known {
        Some(&(_, layout)) if native && layout.size > 0 => Ok(layout),
        Some(&(_, layout)) if native => Ok(Layout {
            size: dtype.getattr(intern!(obj.py(), "itemsize"))?.extract()?,
            ..layout
        }),
        _ => Err(PyTypeError::new_err(format!(
            "token IDs are integers: an array of dtype {} cannot hold them (use uint32)",
            dtype.str()?
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
        // Whole 4-byte chunks, one vectorised pass.
        let (words, _) = bytes.as_chunks::<4>();
        return Ok(words.iter().map(|w| u32::from_ne_bytes(*w)).collect());
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
