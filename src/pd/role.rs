//! What a worker does in a disaggregated fleet.

use crate::error::Error;

/// A worker's role: it prefills prompts and hands their KV on, decodes prompts prefilled
/// elsewhere (and may prefill its own), or both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Role {
    /// Prefills prompts for other workers to decode; never decodes.
    Prefill,
    /// Decodes: takes a prompt's KV from a prefill worker, or prefills it itself.
    Decode,
    /// Prefills and decodes (an aggregated worker). The default.
    #[default]
    Both,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 3] = [Role::Prefill, Role::Decode, Role::Both];

    /// The role's name: `prefill`, `decode` or `both`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Both => "both",
        }
    }

    /// The role named `name` (as [`name`](Self::name) gives it, or `P`, `D`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for any other name.
    pub fn parse(name: &str) -> Result<Self, Error> {
        match name {
            "P" => Ok(Role::Prefill),
            "D" => Ok(Role::Decode),
            _ => Self::ALL
                .into_iter()
                .find(|r| r.name() == name)
                .ok_or_else(|| crate::config::invalid("role", name, "prefill, decode or both")),
        }
    }

    /// Whether it may decode a request.
    #[must_use]
    pub fn decodes(self) -> bool {
        self != Role::Prefill
    }

    /// Whether it may prefill for another worker.
    #[must_use]
    pub fn prefills_for_others(self) -> bool {
        self != Role::Decode
    }
}
