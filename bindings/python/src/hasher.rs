//! The crate's `PrefixHasher` for hosts that keep their own index, and vLLM's namespace
//! salt.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::OrRaise;
use crate::router::algorithm;

/// Block-aligned, chained prefix hashes: one per full block, each naming its whole prefix.
#[pyclass(frozen, module = "prefix_router")]
pub(crate) struct PrefixHasher(prefix_router::PrefixHasher);

#[pymethods]
impl PrefixHasher {
    #[new]
    #[pyo3(signature = (block_size=16, *, hash="xxh3", seed=None))]
    fn new(block_size: usize, hash: &str, seed: Option<u64>) -> PyResult<Self> {
        let mut h =
            prefix_router::PrefixHasher::with_algorithm(block_size, algorithm(hash)?).or_raise()?;
        if let Some(s) = seed {
            h = h.with_seed(s);
        }
        Ok(Self(h))
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.0.block_size()
    }

    /// One chained hash per full block of `tokens` (a trailing partial block is not hashed).
    #[pyo3(signature = (tokens, *, salt=None))]
    fn hash(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        salt: Option<Vec<u8>>,
    ) -> PyResult<Vec<u64>> {
        let tokens = crate::tokens::extract(tokens)?;
        let salt = salt.unwrap_or_default();
        let hashes = py.detach(|| self.0.hash_salted(&salt, &tokens));
        Ok(hashes.iter().map(|h| h.get()).collect())
    }
}

/// The salt vLLM's LoRA name and cache salt map to, as the router hashes them.
#[pyfunction]
#[pyo3(signature = (lora=None, cache_salt=None))]
pub(crate) fn namespace_salt<'py>(
    py: Python<'py>,
    lora: Option<&str>,
    cache_salt: Option<&str>,
) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &prefix_router::namespace_salt(lora, cache_salt))
}
