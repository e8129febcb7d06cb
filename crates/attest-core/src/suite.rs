//! What makes a list of assertions a suite the evaluator can run: each has
//! a non-empty id of at most [`MAX_ASSERTION_ID_BYTES`], unique in the
//! suite (results are matched to assertions by it), a known type, and a
//! spec that compiles. Every front door checks the same rules in the same
//! order through [`SuiteReader`]; [`SuiteError`] names the assertion and
//! the member at fault, and the wire renders it with its own field paths.

use crate::layers::{AssertionType, SpecError};
use crate::text::quote;
use std::collections::HashMap;

/// Longest accepted `assertion_id`, in bytes.
pub const MAX_ASSERTION_ID_BYTES: usize = 256;

/// What a list of assertions looks like, for errors about its shape.
pub const ASSERTIONS_SHAPE: &str =
    "Send assertions as a list of {\"assertion_id\": str, \"type\": str, \"spec\": {...}, \"request_id\"?: str}.";

/// Why a list of assertions is not a suite. `index` is the assertion's
/// position in the list.
#[derive(Debug, Clone, PartialEq)]
pub enum SuiteError {
    /// No `assertion_id`, or an empty one (`empty`).
    MissingId {
        index: usize,
        empty: bool,
    },
    IdTooLong {
        index: usize,
        id: String,
    },
    MissingType {
        index: usize,
        id: String,
    },
    UnknownType {
        index: usize,
        id: String,
        given: String,
    },
    DuplicateId {
        index: usize,
        first: usize,
        id: String,
    },
    Spec {
        index: usize,
        id: String,
        kind: AssertionType,
        error: SpecError,
    },
}

impl SuiteError {
    /// The position of the assertion at fault.
    pub fn index(&self) -> usize {
        match self {
            SuiteError::MissingId { index, .. }
            | SuiteError::IdTooLong { index, .. }
            | SuiteError::MissingType { index, .. }
            | SuiteError::UnknownType { index, .. }
            | SuiteError::DuplicateId { index, .. }
            | SuiteError::Spec { index, .. } => *index,
        }
    }

    /// The id of the assertion at fault, when it has one.
    pub fn assertion_id(&self) -> Option<&str> {
        match self {
            SuiteError::MissingId { .. } => None,
            SuiteError::IdTooLong { id, .. }
            | SuiteError::MissingType { id, .. }
            | SuiteError::UnknownType { id, .. }
            | SuiteError::DuplicateId { id, .. }
            | SuiteError::Spec { id, .. } => Some(id),
        }
    }

    /// The member at fault, from the assertion down (`type`, `spec.check`).
    pub fn field(&self) -> &str {
        match self {
            SuiteError::MissingId { .. } | SuiteError::IdTooLong { .. } | SuiteError::DuplicateId { .. } => "assertion_id",
            SuiteError::MissingType { .. } | SuiteError::UnknownType { .. } => "type",
            SuiteError::Spec { error, .. } => &error.field,
        }
    }

    /// What to do about it.
    pub fn detail(&self) -> String {
        match self {
            SuiteError::MissingId { .. } => ASSERTIONS_SHAPE.into(),
            SuiteError::IdTooLong { .. } => format!("assertion_id must be at most {MAX_ASSERTION_ID_BYTES} bytes."),
            SuiteError::MissingType { .. } => format!("Set type to one of: {}.", AssertionType::names()),
            SuiteError::UnknownType { .. } => format!("Supported assertion types: {}.", AssertionType::names()),
            SuiteError::DuplicateId { .. } => "assertion_id must be unique within a batch: results are matched to assertions by it.".into(),
            SuiteError::Spec { error, .. } => error.detail.clone(),
        }
    }
}

impl std::fmt::Display for SuiteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SuiteError::MissingId { index, empty: false } => write!(f, "assertions[{index}] missing required field: assertion_id"),
            SuiteError::MissingId { index, empty: true } => write!(f, "assertions[{index}] assertion_id is empty"),
            SuiteError::IdTooLong { id, .. } => write!(f, "assertion_id exceeds maximum length: {} > {MAX_ASSERTION_ID_BYTES}", id.len()),
            SuiteError::MissingType { id, .. } => write!(f, "assertion {}: missing required field: type", quote(id)),
            SuiteError::UnknownType { id, given, .. } => {
                write!(f, "assertion {}: unknown assertion type {}", quote(id), quote(given))
            }
            SuiteError::DuplicateId { index, first, id } => write!(
                f,
                "duplicate assertion_id {} in batch (assertions[{first}] and assertions[{index}])",
                quote(id)
            ),
            SuiteError::Spec { id, kind, error, .. } => {
                write!(f, "assertion {} ({}): {}", quote(id), kind.name(), error.message)
            }
        }
    }
}

impl std::error::Error for SuiteError {}

/// Checks each assertion's id and type as a suite is read, in list order,
/// remembering the ids seen so far.
#[derive(Default)]
pub struct SuiteReader<'a> {
    seen: HashMap<&'a str, usize>,
}

impl<'a> SuiteReader<'a> {
    pub fn with_capacity(assertions: usize) -> SuiteReader<'a> {
        SuiteReader {
            seen: HashMap::with_capacity(assertions),
        }
    }

    /// The `index`th assertion's id: present, non-empty and short enough.
    pub fn id(&self, index: usize, id: Option<&'a str>) -> Result<&'a str, SuiteError> {
        match id {
            Some(id) if id.len() > MAX_ASSERTION_ID_BYTES => Err(SuiteError::IdTooLong { index, id: id.to_owned() }),
            Some(id) if !id.is_empty() => Ok(id),
            _ => Err(SuiteError::MissingId {
                index,
                empty: id.is_some(),
            }),
        }
    }

    /// The `index`th assertion's type, given its checked `id`; the id must
    /// not have been seen before.
    pub fn kind(&mut self, index: usize, id: &'a str, kind: Option<&str>) -> Result<AssertionType, SuiteError> {
        let Some(given) = kind else {
            return Err(SuiteError::MissingType { index, id: id.to_owned() });
        };
        let Some(kind) = AssertionType::parse(given) else {
            return Err(SuiteError::UnknownType {
                index,
                id: id.to_owned(),
                given: given.to_owned(),
            });
        };
        if let Some(first) = self.seen.insert(id, index) {
            return Err(SuiteError::DuplicateId {
                index,
                first,
                id: id.to_owned(),
            });
        }
        Ok(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_types_are_checked_in_order_and_named() {
        let mut r = SuiteReader::default();
        assert_eq!(r.id(0, None), Err(SuiteError::MissingId { index: 0, empty: false }));
        assert_eq!(r.id(0, Some("")), Err(SuiteError::MissingId { index: 0, empty: true }));
        let long = "x".repeat(MAX_ASSERTION_ID_BYTES + 1);
        let e = r.id(1, Some(&long)).unwrap_err();
        assert_eq!(e.field(), "assertion_id");
        assert!(e.to_string().contains("257 > 256"), "{e}");
        assert_eq!(r.kind(0, "a", Some("content")), Ok(AssertionType::Content));
        let e = r.kind(1, "b", Some("contents")).unwrap_err();
        assert_eq!(e.field(), "type");
        assert!(e.detail().contains("content, embedding"), "{}", e.detail());
        assert_eq!(
            r.kind(2, "a", Some("schema")),
            Err(SuiteError::DuplicateId {
                index: 2,
                first: 0,
                id: "a".into()
            })
        );
        assert_eq!(
            r.kind(3, "c", None).unwrap_err().to_string(),
            "assertion 'c': missing required field: type"
        );
    }
}
